"""Cached, race-safe model builds shared by the offline models of `grpo_hub.tasks`.

A build is keyed by a fingerprint of its recipe (everything that shapes the weights), so a changed recipe
never reuses a stale folder. Each caller builds into a private temporary sibling folder and renames it into
place: two processes building at once both return the same complete folder, and the loser's copy is dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

COMPLETE_FILES = ("config.json", "model.safetensors")


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


def cached_build(target: Path, write: Callable[[Path], None], caller: str) -> str:
    """Return `target`, first running `write(folder)` into a staging folder renamed to `target` if needed.

    A `target` holding every `COMPLETE_FILES` is returned unchanged; a non-empty `target` without them is
    refused (FileExistsError); an empty one (made by the caller) is replaced.
    """
    if all((target / name).is_file() for name in COMPLETE_FILES):
        return str(target)
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(
            f"{caller}: {target} exists but holds no complete model; pass an empty or new `output_dir`"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(staging)
        staging.chmod(0o755)
        if target.exists():
            target.rmdir()  # empty folder left by the caller
        os.rename(staging, target)
    except OSError:
        if not all((target / name).is_file() for name in COMPLETE_FILES):
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)
