"""Shared test setup: small thread counts on the 2-core machine, `requires` for optional stacks, free ports,
the tiny model."""

import importlib.util
import os
import socket
from pathlib import Path
from typing import NoReturn

import pytest
import torch
from hypothesis import settings

torch.set_num_threads(1)
# A recipe run in-process (and any subprocess) keeps one thread too (grpo_hub.config.cpu_threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Property tests draw the same examples on every run (a CI failure reproduces; no example database is written).
settings.register_profile("deterministic", derandomize=True, database=None)
settings.load_profile("deterministic")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def skip_or_fail(message: str) -> NoReturn:
    """A missing optional stack: skip the calling test locally; in CI it is a failure."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def requires(module: str, why: str = "") -> None:
    """Skip the calling test when `module` is missing locally; in CI a missing stack is a failure."""
    if importlib.util.find_spec(module) is None:
        skip_or_fail(f"{module} is not installed{': ' + why if why else ''} (.ci/run installs it)")


@pytest.fixture(scope="session")
def tiny_model_dir():
    """Folder of the offline tiny model (built once per machine by grpo_hub.tasks)."""
    from grpo_hub.tasks import build_tiny_model

    return build_tiny_model()
