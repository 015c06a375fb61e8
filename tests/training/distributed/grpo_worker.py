"""Worker for the distributed tests: train the tiny model with GRPO on this rank, once per run, one run after
the other in this one launch (starting the ranks costs more than a short run); write <name>/rank<k>.json per run.

Run by tests/training/distributed/launch.py under `accelerate launch` (2 CPU ranks: DDP over gloo, or DeepSpeed)
with `--runs '{"name": [run arguments], ...}'` (the run arguments are those of `parse_args`). `--trainer trl`
uses plain `trl.GRPOTrainer` + `GRPOConfig`; `--trainer hub` uses `GRPOHubTrainer` + `GRPOHubConfig` with
`--hub-config` (JSON of extra config fields). The JSON records the world the rank saw (world size, backend),
the kinds of rows it scored, TRL's log history, and how far the trainable parameters moved (gathered under
ZeRO-3).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from grpo_hub.training.distributed import gathered
from tests.helpers import tiny_config
from tests.training.distributed.scenarios import SCENARIOS, build_dataset, build_rewards
from tests.training.distributed.worker_common import (
    count_scored_tokens,
    run_each,
    weight_fingerprint,
    write_rank_result,
)

NUM_GENERATIONS = 4
PROMPTS_PER_RANK = 2
WORLD_SIZE = 2


def parse_args(argv: list[str]) -> argparse.Namespace:
    """One run's arguments."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trainer", choices=("trl", "hub"), required=True)
    parser.add_argument("--scenario", choices=SCENARIOS, default="task")
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument(
        "--grad-accum", type=int, default=1, help="= steps_per_generation (micro-steps per batch)"
    )
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter instead of all weights")
    parser.add_argument("--hub-config", default="{}", help="JSON of GRPOHubConfig fields (--trainer hub)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scripted-clock",
        action="store_true",
        help="time_budget_seconds reads a scripted clock: rank k's step s ends at (k + 1) (3 + s) seconds",
    )
    return parser.parse_args(argv)


def scripted_clock(rank: int):
    """Rank `rank`'s clock for the time budget: 0 at train begin, then (rank + 1) (3 + n) at its n-th step end."""
    reads = iter(range(10_000))
    return lambda: 0.0 if (n := next(reads)) == 0 else (rank + 1) * (3.0 + n)


def trainable_state(model) -> dict[str, torch.Tensor]:
    """fp32 copies of the trainable parameters, gathered from their ZeRO-3 shards when partitioned."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    with gathered([p for _, p in named]):
        return {name: p.detach().float().clone() for name, p in named}


def max_change(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    assert before.keys() == after.keys(), "trainable parameter names changed during training"
    return max((after[name] - before[name]).abs().max().item() for name in before)


def build_config(args: argparse.Namespace, output_dir: str):
    if args.trainer == "trl":
        from trl import GRPOConfig as config_cls

        extra = {}
    else:
        from grpo_hub import GRPOHubConfig as config_cls

        extra = json.loads(args.hub_config)
    return tiny_config(
        output_dir,
        config_cls,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        gradient_accumulation_steps=args.grad_accum,
        per_device_train_batch_size=NUM_GENERATIONS * PROMPTS_PER_RANK,
        num_generations=NUM_GENERATIONS,
        max_completion_length=16,
        temperature=1.0,
        shuffle_dataset=False,
        seed=args.seed,
        dataloader_num_workers=0,
        **extra,
    )


def build_trainer(args: argparse.Namespace, config, scored: Counter):
    from grpo_hub.tasks import build_tiny_model

    if args.trainer == "trl":
        from trl import GRPOTrainer as trainer_cls
    else:
        from grpo_hub import GRPOHubTrainer as trainer_cls
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    prompts_per_rank = PROMPTS_PER_RANK * args.grad_accum  # per generation batch
    n_prompts = args.max_steps * WORLD_SIZE * prompts_per_rank
    return trainer_cls(
        model=build_tiny_model(),
        reward_funcs=build_rewards(args.scenario, scored),
        args=config,
        train_dataset=build_dataset(args.scenario, n_prompts, prompts_per_rank, args.seed),
        peft_config=peft_config,
    )


def train(args: argparse.Namespace, result_dir: Path) -> None:
    """One run: train, then write this rank's result to `result_dir`/rank<k>.json."""
    config = build_config(args, str(result_dir / "trainer_output"))
    scored: Counter = Counter()
    trainer = build_trainer(args, config, scored)
    if args.scripted_clock:
        trainer._time_budget.clock = scripted_clock(trainer.accelerator.process_index)
    scored_tokens = count_scored_tokens(trainer.model)
    before = trainable_state(trainer.model)
    train_output = trainer.train()
    after = trainable_state(trainer.model)
    write_rank_result(
        trainer,
        result_dir,
        trainer=type(trainer).__name__,
        scored=dict(scored),
        train_loss=train_output.training_loss,
        max_param_change=max_change(before, after),
        params_finite=all(torch.isfinite(t).all().item() for t in after.values()),
        param_fingerprint=weight_fingerprint(after.values()),
        n_trainable=sum(t.numel() for t in after.values()),
        scored_tokens=scored_tokens[0],
        packed_forwards=scored_tokens[1],
    )


if __name__ == "__main__":
    run_each(train, parse_args, __doc__)
