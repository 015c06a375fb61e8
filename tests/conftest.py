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
# Property tests draw the same examples on every run (a CI failure reproduces; no example database is written), with
# no per-example time limit (hypothesis's default 200 ms is crossed on a slow or busy machine).
settings.register_profile("deterministic", derandomize=True, database=None, deadline=None)
settings.load_profile("deterministic")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# The hang guard of every run a test waits on (a subprocess, a server start, a browser page): one that takes longer has
# hung. 30 min: the slowest run, the README's main job, takes 7-8 min here, so a machine 2x slower still has 2x room.
RUN_LIMIT_S = 1800
# Session fixtures that cost seconds to minutes (a vLLM server and the runs against it, vLLM colocate runs, a run
# pushed live to the local Hub, trained adapters), by the pytest-xdist group of the tests that use them: each group runs
# on one worker, so each fixture is built once.
COSTLY_SESSION_FIXTURES = {
    "one_rank_runs": "vllm-colocate-runs",
    "two_rank_runs": "vllm-colocate-runs",
    "vllm_server": "vllm-server",
    "fake_hub": "fake-hub",
    "random_adapter": "compare-adapters",
    "zero_adapter": "compare-adapters",
    "trained_adapter": "compare-adapters",
}
HEAVY_MARKERS = ("slow", "distributed", "deepspeed", "vllm")


def xdist_group(item) -> str:
    """A test's pytest-xdist group: its costly session fixture's, else its file's when it uses a fixture shared within
    the file (module, class or package scope: built once), else its own."""
    costly = [COSTLY_SESSION_FIXTURES[name] for name in item.fixturenames if name in COSTLY_SESSION_FIXTURES]
    if costly:
        return costly[0]
    definitions = item._fixtureinfo.name2fixturedefs.values()  # pytest's record of the fixtures the test uses
    shared = any(defs[-1].scope in ("module", "class", "package") for defs in definitions)
    return item.path.relative_to(REPO_ROOT / "tests").as_posix() if shared else item.nodeid


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(items):
    """Groups for pytest-xdist's `--dist loadgroup` (pyproject's addopts), handed out in collection order
    (`--no-loadscope-reorder`): the groups with a heavy test (HEAVY_MARKERS) first, so that the cheap ones fill the
    end of the run on both workers."""
    # this suite's tests, not others collected beside them
    ours = [item for item in items if REPO_ROOT / "tests" in item.path.parents]
    groups = {item.nodeid: xdist_group(item) for item in ours}
    for item in ours:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    heavy = {groups[item.nodeid] for item in ours if any(item.get_closest_marker(m) for m in HEAVY_MARKERS)}
    items.sort(key=lambda item: groups.get(item.nodeid) not in heavy)


class CostlyFixtureGuard:
    """A costly session fixture is built only for a test that names it among its arguments (or its fixtures'): one
    fetched by `request.getfixturevalue` is not in the test's xdist group, so another worker would build it again.
    A plugin, not a conftest hook: pytest asks a session fixture's hooks of the root folder's conftests only."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_setup(self, fixturedef, request):
        item = getattr(request, "_pyfuncitem", None)  # the test being set up
        if (
            fixturedef.argname in COSTLY_SESSION_FIXTURES
            and item
            and fixturedef.argname not in item.fixturenames
        ):
            pytest.fail(
                f"{item.nodeid} fetches the costly session fixture {fixturedef.argname!r} without naming it, so its "
                f"pytest-xdist group does not hold it and another worker would build it again. Fix: name it in the "
                f"test's arguments or in @pytest.mark.usefixtures."
            )


def pytest_configure(config):
    config.pluginmanager.register(CostlyFixtureGuard(), "grpo-hub-costly-fixture-guard")


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
