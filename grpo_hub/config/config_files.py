"""YAML config files of `recipes/grpo.py`: a file may extend a parent and state only what differs.

    # recipes/configs/chain-fast.yaml
    base: chain.yaml          # a path relative to this file; its keys (and its parent's) are read first
    dynamic_sampling: true

`read_config(path)` returns the merged mapping: the parent's keys, overridden by the child's (chains of parents
are followed; a cycle is refused).
"""

from __future__ import annotations

from pathlib import Path

import yaml

PARENT_KEY = "base"


def read_config(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict:
    """The mapping of the YAML file at `path`, merged over the parent it names under `base` (if any)."""
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ValueError(
            f"config {path}: `{PARENT_KEY}` forms a cycle ({chain}). Fix: remove one `{PARENT_KEY}`."
        )
    config = yaml.safe_load(path.read_text())
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(
            f"config {path} must hold a YAML mapping (key: value lines), got {type(config).__name__}."
        )
    if PARENT_KEY not in config:
        return config
    parent = config.pop(PARENT_KEY)
    if not isinstance(parent, str) or not parent.strip():
        raise ValueError(
            f"`{PARENT_KEY}`: must be the path of a parent YAML file, got {type(parent).__name__} {parent!r} (in "
            f"{path}). Fix: write e.g. `{PARENT_KEY}: chain.yaml`, a path relative to {path.parent}, or drop it."
        )
    parent_path = path.parent / parent
    if not parent_path.is_file():
        raise ValueError(
            f"config {path}: `{PARENT_KEY}: {parent}` names no file ({parent_path}). Fix: give a path relative to {path.parent}."
        )
    return {**read_config(parent_path, (*_seen, path)), **config}
