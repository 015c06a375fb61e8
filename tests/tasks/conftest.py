"""Tasks' test setup: the full chain-model rebuild (one thread, ~8-13 min) runs in a background process at the
lowest CPU priority from the end of collection, on the cycles the rest of the suite leaves idle; its test runs last
and waits for it. Run alone, the test costs what the build costs."""

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REBUILD_TEST = "test_the_build_reproduces_the_shipped_weights"
_BUILD = pytest.StashKey[dict]()
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _low_priority_child() -> None:
    """In the child before exec: nice 19, and SIGTERM when pytest dies (even by SIGKILL, where no hook runs)."""
    os.nice(19)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _is_rebuild(item) -> bool:
    return getattr(item, "originalname", item.name) == REBUILD_TEST


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The rebuild's test last (a stable sort: every other test keeps its place)."""
    items.sort(key=_is_rebuild)


def pytest_collection_finish(session):
    """Start the rebuild now if its test was selected (after every deselection), at nice 19."""
    if session.config.option.collectonly or not any(_is_rebuild(item) for item in session.items):
        return
    folder = Path(tempfile.mkdtemp(prefix="chain-rebuild-"))
    log = (folder / "build.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "grpo_hub.tasks.chain_model", "--output-dir", str(folder / "model")],
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_low_priority_child,
    )
    session.config.stash[_BUILD] = {"process": process, "folder": folder, "log": log}


def pytest_sessionfinish(session):
    """Stop a build still running (an interrupted or failed session) and remove its folder."""
    build = session.config.stash.get(_BUILD, None)
    if build is None:
        return
    build["process"].kill()  # a no-op once it has exited
    build["process"].wait()
    build["log"].close()
    shutil.rmtree(build["folder"], ignore_errors=True)


@pytest.fixture
def background_rebuild(request) -> Path:
    """The background build's model folder once it has finished; a failed build fails the test with its log."""
    build = request.config.stash[_BUILD]
    if build["process"].wait() != 0:
        pytest.fail(f"the chain-model build failed:\n{(build['folder'] / 'build.log').read_text()[-4000:]}")
    return build["folder"] / "model"
