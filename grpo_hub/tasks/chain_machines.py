"""Which CPU kinds reproduce the shipped chain model, and the short proof on them.

A long build's weights depend on the CPU's kernels: on the kind that built the shipped weights the full build gives
them bit for bit; on another kind its rounding drifts over 1,100 steps, and the build gives weights of the same
held-out accuracy (within `ACCURACY_TOLERANCE`) instead. The shipped folder's record (`MACHINES_FILE`) keeps, per CPU
kind whose full build reproduced the shipped weights that way, the build's trace (`grpo_hub.tasks.build_trace`): its
state's checksums after the first steps, its weights' sha256 and held-out accuracy, under the inputs digest they were
made with. On a machine whose short build computes a recorded kind's first steps bit for bit, with today's inputs,
the full build would compute what that kind's did.

    python -m grpo_hub.tasks.chain_machines [DIR]    # record this CPU kind's full build (DIR, or built now)
    python -m grpo_hub.tasks.chain_machines --ship [DIR]    # ship that build as the weights, then record it

This module is not part of the build (not in `chain_model.BUILD_MODULES`): editing it changes no digest.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from grpo_hub.tasks import chain
from grpo_hub.tasks.build_trace import file_checksum, read_trace
from grpo_hub.tasks.chain_model import SHIPPED_DIR, build_chain_model, build_inputs_digest

MACHINES_FILE = "build_machines.json"
# A build on another CPU kind reproduces the shipped model when its held-out accuracy is within this of theirs.
ACCURACY_TOLERANCE = 0.10


def cpu_description() -> str:
    """This CPU in words (its model name and torch's kernel level), for the machines record."""
    import platform

    import torch

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    name = names[0] if names else platform.processor() or "unknown CPU"
    return f"{name}, torch {torch.backends.cpu.get_cpu_capability()} kernels"


def read_machines(folder: Path) -> dict:
    """The machines record of a shipped build (`MACHINES_FILE`): the inputs digest and the shipped weights' sha256 and
    held-out accuracy, and per CPU kind that ran the full build, its trace's step checksums, weights and accuracy."""
    return json.loads((Path(folder) / MACHINES_FILE).read_text())


def machine_for(machines: dict, steps: dict[str, str]) -> dict | None:
    """The recorded machine whose first steps computed `steps` bit for bit (None: no recorded CPU kind does)."""
    return next((m for m in machines["machines"] if m["steps"] == steps), None)


def reproduces(machines: dict, machine: dict) -> bool:
    """True when `machine`'s full build gave the shipped weights: bit for bit, or (another CPU kind's kernels round
    differently over a long build) the same held-out accuracy within `ACCURACY_TOLERANCE`."""
    return machine["weights"] == machines["weights"] or (
        abs(machine["heldout"] - machines["heldout"]) <= ACCURACY_TOLERANCE
    )


def record_machine(
    folder: Path, digest: str, built_trace: dict, heldout: float, shipped_heldout: float
) -> dict:
    """Add this machine's full build (its trace and held-out accuracy) to `folder`'s machines record, starting a new
    record when `digest` is not the recorded one; refuse a build that does not reproduce the shipped weights."""
    weights = file_checksum(folder / "model.safetensors")
    try:
        machines = read_machines(folder)
    except FileNotFoundError:
        machines = {}
    if machines.get("inputs_digest") != digest or machines.get("weights") != weights:
        machines = {"inputs_digest": digest, "weights": weights, "heldout": shipped_heldout, "machines": []}
    if built_trace["inputs_digest"] != digest:
        raise ValueError("record_machine: the build's inputs digest is not today's; rebuild before recording")
    entry = {
        "cpu": cpu_description(),
        "steps": built_trace["steps"],
        "weights": built_trace["weights"],
        "heldout": heldout,
    }
    if not reproduces(machines, entry):
        raise ValueError(
            f"record_machine: this machine's build scores {heldout:.4f} held-out against the shipped "
            f"{machines['heldout']:.4f} (tolerance {ACCURACY_TOLERANCE}): it does not reproduce the shipped weights"
        )
    machines["machines"] = [m for m in machines["machines"] if m["steps"] != entry["steps"]] + [entry]
    (folder / MACHINES_FILE).write_text(json.dumps(machines, indent=1, sort_keys=True) + "\n")
    return entry


def heldout_accuracy(folder: str | os.PathLike) -> float:
    """Greedy held-out accuracy (all 2,000 problems) of the chain model in `folder`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    return chain.evaluate(model, tokenizer)["greedy"]["all"]


def record_this_machine(built: str | os.PathLike) -> dict:
    """Add the full build in `built` (made on this machine) to the shipped machines record (see the module doc)."""
    trace = read_trace(built)
    heldout = heldout_accuracy(built)
    same = trace["weights"] == file_checksum(SHIPPED_DIR / "model.safetensors")
    shipped_heldout = heldout if same else heldout_accuracy(SHIPPED_DIR)
    return record_machine(SHIPPED_DIR, build_inputs_digest(), trace, heldout, shipped_heldout)


def ship(built: str | os.PathLike) -> dict:
    """Replace the shipped weights with the full build in `built` (made on this machine) and start their machines record
    with this CPU kind's build."""
    shutil.rmtree(SHIPPED_DIR, ignore_errors=True)
    shutil.copytree(built, SHIPPED_DIR)
    for path in SHIPPED_DIR.iterdir():
        path.chmod(0o644)  # the staging build's files are private; package data is world-readable
    return record_this_machine(SHIPPED_DIR)  # the builder's CPU kind, bit for bit


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        description="Record this CPU kind's full chain-model build in the shipped record (--ship: ship it first)."
    )
    parser.add_argument(
        "dir", nargs="?", help="a full build made here (`chain_model --output-dir`); default: build now"
    )
    parser.add_argument(
        "--ship", action="store_true", help="replace the shipped weights with the build first"
    )
    cli = parser.parse_args()
    built = cli.dir or build_chain_model()
    print(json.dumps(ship(built) if cli.ship else record_this_machine(built), indent=1))
