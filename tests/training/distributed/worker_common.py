"""Shared by the worker scripts the distributed tests launch under `accelerate launch` (launch.py):
grpo_worker.py, ../reference/ref_worker.py, ../dynamic/dynamic_worker.py, ../selective/selective_worker.py.

`launch_env()` puts the repository root on PYTHONPATH, so a worker run as a script imports this module (and
tests.helpers) as `tests....`. After training, a worker writes its rank's result with `write_rank_result(trainer,
result_dir, **fields)`: the world the rank saw, its global step and TRL's log history (read by checks.py), plus
the worker's own fields; a worker that trains several runs in one launch (`run_accelerate_runs`) hands its `train` to `run_each`.
A worker's main ends with `end_ranks()`, as a user's script ends with `trainer.end()` (`run_each` calls it).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.distributed as dist

from tests.helpers import tiny_config


def run_each(
    train: Callable[[argparse.Namespace, Path], None],
    parse_args: Callable[[list[str]], argparse.Namespace],
    description: str | None = None,
) -> None:
    """Main of a multi-run worker: `--runs '{"name": [run arguments], ...}' --result-dir DIR`; trains each run,
    one after the other, with `train(parse_args(run arguments), DIR / name)`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", required=True, help="JSON: {run name: [run arguments]}")
    parser.add_argument("--result-dir", required=True)
    cli = parser.parse_args()
    for name, argv in json.loads(cli.runs).items():
        train(parse_args(argv), Path(cli.result_dir) / name)
    end_ranks()


def end_ranks() -> None:
    """Destroy the process group, as `Trainer.end()` does at the end of a user's script: left to the interpreter's
    exit, a 2-rank run that trained and wrote its results was seen to abort in teardown ("terminate called without
    an active exception", SIGABRT), failing its launch."""
    if dist.is_initialized():
        dist.destroy_process_group()


def single_run_parser(description: str | None, max_steps: int) -> argparse.ArgumentParser:
    """Arguments of a one-run worker: `--max-steps` (default `max_steps`) and `--result-dir`; add the worker's own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--max-steps", type=int, default=max_steps)
    parser.add_argument("--result-dir", required=True)
    return parser


def single_run_config(args: argparse.Namespace, **overrides):
    """GRPOHubConfig of a one-run worker (`--result-dir`, `--max-steps`): `tests.helpers.tiny_config` writing into
    <result-dir>/out, learning rate 1e-3, prompts in dataset order (`shuffle_dataset=False`: the tests know which
    rank scores which prompt); `overrides` win."""
    settings = {"max_steps": args.max_steps, "learning_rate": 1e-3, "shuffle_dataset": False, **overrides}
    return tiny_config(Path(args.result_dir) / "out", **settings)


def weight_fingerprint(tensors: Iterable[torch.Tensor]) -> float:
    """Sum of the absolute values of `tensors` in float64: equal weights on two ranks give equal fingerprints."""
    return sum(t.detach().double().abs().sum().item() for t in tensors)


def count_scored_tokens(model) -> list[int]:
    """[tokens, packed forwards] of every forward of `model` given labels (the scoring forwards: training, TRL's
    scoring, reference; not generation): the tokens it received, and how many of those forwards received packed rows
    (position ids: TRL's padded forward passes none), kept up to date by a forward pre-hook."""
    count = [0, 0]

    def hook(module, args, kwargs):
        if "labels" in kwargs:
            count[0] += kwargs["input_ids"].numel()
            count[1] += kwargs.get("position_ids") is not None

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return count


def rank_result(trainer, /, **fields) -> dict:
    """This rank's result after `trainer.train()`: rank, world size, backend, accelerate distributed type,
    global step and log history, then the worker's own `fields`."""
    accelerator = trainer.accelerator
    return {
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "distributed_type": str(accelerator.distributed_type),
        "global_step": trainer.state.global_step,
        "log_history": trainer.state.log_history,
        **fields,
    }


def write_rank_result(trainer, result_dir: Path, /, **fields) -> None:
    """Write `rank_result(trainer, **fields)` to `result_dir`/rank<k>.json (k: this rank), then wait until every
    rank has written."""
    accelerator = trainer.accelerator
    result_dir = Path(result_dir)
    result_dir.mkdir(parents=True, exist_ok=True)
    result = rank_result(trainer, **fields)
    (result_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps(result, allow_nan=True))
    accelerator.wait_for_everyone()
