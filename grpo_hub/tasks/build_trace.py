"""A model build's trace: what proves a shipped build reproducible without running it whole.

A full build records beside its weights (`TRACE_FILE`): the checksum of the model's state after the first steps
of training (`state_checksum`, step 0 = the initial weights), the sha256 of the weights file it wrote, and the
digest of its inputs (`inputs_digest`: its recipe, the source of the modules it runs, the tokenizer it makes,
torch's version). The bits depend on the CPU's kernels: a short build that runs the same code for those first
steps and gives a full build's recorded checksums runs on kernels that round as that build's did, and with the same
inputs the rest of the full build is the same computation (`grpo_hub.tasks.chain_machines` keeps such records per CPU
kind). When the inputs digest differs, only the full build can say whether the weights still follow.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType

TRACE_FILE = "build_trace.json"


def state_checksum(state: Mapping) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order (bit-exact equality of states)."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def file_checksum(path: str | Path) -> str:
    """sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def inputs_digest(recipe: dict, modules: Iterable[ModuleType], tokenizer_json: str) -> str:
    """sha256 of what shapes a build: its recipe, the source of `modules` (every module it runs), the tokenizer it
    makes (serialised) and torch's version. Any edit to those modules changes it, a docstring included."""
    import torch

    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    for module in sorted(modules, key=lambda m: m.__name__):
        digest.update(f"\0{module.__name__}\0{inspect.getsource(module)}".encode())
    digest.update(f"\0tokenizer\0{tokenizer_json}\0torch\0{torch.__version__}".encode())
    return digest.hexdigest()


class StepRecorder:
    """Called after every training step (and with step 0 before the first): keeps `state_checksum` of the model's
    state at the steps asked for."""

    def __init__(self, steps: Iterable[int]):
        self.steps = set(steps)
        self.checksums: dict[str, str] = {}

    def __call__(self, step: int, model) -> None:
        if step in self.steps:
            self.checksums[str(step)] = state_checksum(model.state_dict())


def write_trace(folder: Path, digest: str, checksums: dict[str, str], weights_file: str) -> None:
    """Write `TRACE_FILE` into `folder`: the inputs digest, the step checksums and the weights file's sha256."""
    trace = {"inputs_digest": digest, "steps": checksums, "weights": file_checksum(folder / weights_file)}
    (folder / TRACE_FILE).write_text(json.dumps(trace, indent=1, sort_keys=True) + "\n")


def read_trace(folder: Path) -> dict:
    """The trace recorded in `folder` (FileNotFoundError when its build recorded none)."""
    return json.loads((Path(folder) / TRACE_FILE).read_text())
