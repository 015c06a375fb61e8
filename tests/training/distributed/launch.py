"""Run a worker script under `accelerate launch` in a subprocess and collect the JSON each rank writes.

`run_accelerate(config, script, args)` picks a free rendezvous port, limits every rank to one thread,
caches DeepSpeed's JIT-built ops under `$TORCH_EXTENSIONS_DIR` (default `~/.cache/torch_extensions`),
kills the whole process group on timeout, and fails with the tail of the output when the launch fails.
The worker receives `--result-dir DIR` and writes `DIR/rank<k>.json` on every rank; `run_accelerate_runs` launches
a worker that trains several runs in one launch and writes `DIR/<run name>/rank<k>.json`.
`run_isolated` is the process-group runner underneath, shared with the vLLM and recipe tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import REPO_ROOT, RUN_LIMIT_S, free_port

ACCELERATE_CONFIGS = REPO_ROOT / "recipes" / "accelerate"
WORKER_DIR = Path(__file__).resolve().parent
TAIL_CHARS = 6000


def launch_env() -> dict[str, str]:
    """Environment for the ranks: one thread each, offline Hub, cached torch extensions, and the repository root
    first on PYTHONPATH (a worker run as a script imports `tests....` and this checkout's grpo_hub)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    return env


def output_tail(text: str) -> str:
    """The last TAIL_CHARS characters of a run's output, for failure messages."""
    return text[-TAIL_CHARS:]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def run_isolated(command: list[str], cwd, env: dict[str, str], what: str) -> str:
    """Run `command` in its own process group and return its output (stdout and stderr).

    The whole group (ranks, vLLM engine and worker processes) is killed afterwards, and after `RUN_LIMIT_S`.
    Raises AssertionError naming `what`, with the output tail, on a timeout (hang?) or a non-zero exit.
    """
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        output, _ = proc.communicate()
        raise AssertionError(
            f"{what} timed out after {RUN_LIMIT_S}s (hang?). Output tail:\n{output_tail(output)}"
        ) from None
    finally:
        _kill_group(proc.pid)  # processes the run may have left behind
    if proc.returncode != 0:
        raise AssertionError(f"{what} exited with {proc.returncode}. Output tail:\n{output_tail(output)}")
    return output


def partitioned_zero3_config(folder: Path) -> Path:
    """Write a 2-rank ZeRO-3 accelerate config with persistence threshold 0 (zero3_partitioned.json) into
    `folder`: by default DeepSpeed keeps small tensors such as LoRA factors whole on every rank, which would
    hide a missing gather."""
    path = Path(folder) / "zero3-partitioned.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
        f"deepspeed_config:\n  deepspeed_config_file: {WORKER_DIR / 'zero3_partitioned.json'}\n"
        "  zero3_init_flag: true\n"
        "machine_rank: 0\nnum_machines: 1\nnum_processes: 2\nrdzv_backend: static\nsame_network: true\n"
    )
    return path


def zero3_config(folder: Path, init_flag: bool) -> Path:
    """recipes/accelerate/cpu-zero3.yaml with `zero3_init_flag` set, written into `folder`. Its inline DeepSpeed
    settings (unlike a deepspeed_config_file) tell TRL the ZeRO stage, so TRL keeps LoRA in the model dtype."""
    text = (ACCELERATE_CONFIGS / "cpu-zero3.yaml").read_text()
    assert "zero3_init_flag: true" in text
    path = Path(folder) / f"cpu-zero3-init{int(init_flag)}.yaml"
    path.write_text(text.replace("zero3_init_flag: true", f"zero3_init_flag: {str(init_flag).lower()}"))
    return path


def run_accelerate(config: str, script: str, args: list[str] | tuple[str, ...] = ()) -> dict:
    """Launch `script` with `recipes/accelerate/<config>` and return {"ranks": [rank0, rank1, ...], **rank0}.

    `config` is a file name in recipes/accelerate (or a path); `script` a file name in tests/training/distributed
    (or a path). Raises AssertionError with the output tail on a non-zero exit, a timeout, or a missing
    rank result.
    """
    with tempfile.TemporaryDirectory(prefix="grpo_hub_dist_") as result_dir:
        output = _launch(config, script, [*args, "--result-dir", result_dir])
        return _rank_results(Path(result_dir), output)


def run_accelerate_runs(config: str, script: str, runs: dict[str, list[str]], keep=None) -> dict:
    """One launch of a worker that trains several runs one after the other (`--runs`, as grpo_worker.py does):
    {run name: {"ranks": [...], **rank0}} from `<result-dir>/<name>/rank<k>.json`. Arguments as run_accelerate;
    `keep(run folder, ranks)`, when given, reads what else a run wrote before the folder is deleted."""
    with tempfile.TemporaryDirectory(prefix="grpo_hub_dist_") as result_dir:
        output = _launch(config, script, ["--runs", json.dumps(runs), "--result-dir", result_dir])
        results = {name: _rank_results(Path(result_dir) / name, output) for name in runs}
        for name, result in results.items():
            if keep is not None:
                keep(Path(result_dir) / name, result["ranks"])
        return results


def _launch(config: str, script: str, args: list[str]) -> str:
    config_path = Path(config) if Path(config).is_file() else ACCELERATE_CONFIGS / config
    script_path = Path(script) if Path(script).is_file() else WORKER_DIR / script
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(config_path),
        "--main_process_port", str(free_port()),
        str(script_path), *args,
    ]  # fmt: skip
    return run_isolated(command, REPO_ROOT, launch_env(), "accelerate launch")


def _rank_results(result_dir: Path, output: str) -> dict:
    rank_files = sorted(result_dir.glob("rank*.json"), key=lambda p: int(p.stem[len("rank") :]))
    if not rank_files:
        raise AssertionError(
            f"no rank wrote a result in {result_dir.name}. Output tail:\n{output_tail(output)}"
        )
    ranks = [json.loads(path.read_text()) for path in rank_files]
    return {**ranks[0], "ranks": ranks}
