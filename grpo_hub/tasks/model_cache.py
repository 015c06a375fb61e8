"""Cached model builds shared by the offline models of `grpo_hub.tasks`: once per machine, complete or not at all.

A build is keyed by a fingerprint of its recipe (everything that shapes the weights), so a changed recipe
never reuses a stale folder. One process per machine builds a folder (a file lock beside it) while the others
wait, then read it. The build fills a private staging folder, renamed into place only once it holds a whole model
(`COMPLETE_FILES`), and `save_model` writes the same files on every rank.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)
COMPLETE_FILES = ("config.json", "model.safetensors", "tokenizer.json")  # config, weights, tokenizer


def default_cache_dir() -> Path:
    """Return the grpo_hub cache root: `$GRPO_HUB_CACHE` if set, else `~/.cache/grpo_hub`."""
    return Path(os.environ.get("GRPO_HUB_CACHE") or Path.home() / ".cache" / "grpo_hub")


def fingerprint(recipe: dict) -> str:
    """Short hash of a JSON-serialisable build recipe."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]


def check_seed(seed, caller: str) -> None:
    """Raise a ValueError naming `caller` unless `seed` is a non-negative int."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"{caller}: `seed` must be a non-negative int, got {seed!r}")


def is_complete(folder: Path) -> bool:
    """True when `folder` holds every `COMPLETE_FILES`."""
    return all((folder / name).is_file() for name in COMPLETE_FILES)


def save_model(folder: Path, model, tokenizer) -> None:
    """`save_pretrained` of `model` and `tokenizer` into `folder`, from any rank.

    Once torch.distributed is initialised, transformers writes no config or weights off rank 0
    (`should_save_on_this_rank`, whatever `is_main_process` says); the builder may be any rank, so this model is
    told to write.
    """
    model.should_save_on_this_rank = lambda is_main_process: True
    try:
        model.save_pretrained(folder, safe_serialization=True)
    finally:
        del model.should_save_on_this_rank
    tokenizer.save_pretrained(folder)


@contextlib.contextmanager
def build_lock(target: Path, caller: str) -> Iterator[None]:
    """Hold an exclusive `flock` on `.<name>.lock` beside `target`; the file is removed on release.

    A process that waits says so once; one that gets the lock of a file its holder removed meanwhile takes a fresh
    one (the inode check), so exactly one process holds the lock of the path at a time.
    """
    path = target.parent / f".{target.name}.lock"
    said = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not said:
                logger.warning("%s: waiting for another process to finish building %s", caller, target)
                said = True
            fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        os.close(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def cached_build(output_dir, name: str, write: Callable[[Path], None], caller: str) -> str:
    """Return the model folder, `output_dir` or else `<cache>/<name>`, first building it if incomplete.

    `write(folder)` fills a staging folder, renamed into place once complete. A cache folder without a complete
    model (left by an earlier version) is rebuilt; a non-empty `output_dir` without one is refused
    (FileExistsError); an empty one (made by the caller) is replaced.
    """
    owned = not output_dir
    target = default_cache_dir() / name if owned else Path(output_dir)
    if is_complete(target):
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(target, caller):
        if not is_complete(target):
            _clear_incomplete(target, owned, caller)
            _build_into(target, write, caller)
    return str(target)


def _clear_incomplete(target: Path, owned: bool, caller: str) -> None:
    """Remove a non-empty `target` without a complete model if the cache owns it, else refuse it."""
    if not target.exists() or not any(target.iterdir()):
        return
    if not owned:
        raise FileExistsError(
            f"{caller}: {target} exists but holds no complete model; pass an empty or new `output_dir`"
        )
    logger.warning("%s: %s holds no complete model (an earlier build's); rebuilding it", caller, target)
    shutil.rmtree(target)


def _build_into(target: Path, write: Callable[[Path], None], caller: str) -> None:
    """Run `write` into a staging folder beside `target` and rename it to `target` once complete.

    A complete `target` that appears meanwhile (a process without the lock: another machine sharing the cache)
    wins; the staging folder is dropped either way.
    """
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(staging)
        missing = [name for name in COMPLETE_FILES if not (staging / name).is_file()]
        if missing:
            raise RuntimeError(f"{caller}: the build wrote no {', '.join(missing)}; nothing was cached")
        staging.chmod(0o755)
        if target.exists():
            target.rmdir()  # empty folder left by the caller
        os.rename(staging, target)
    except OSError:
        if not is_complete(target):
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
