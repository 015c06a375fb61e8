"""Worker for the 2-rank hint tests: GRPOHubTrainer with hint-guided rollouts on the graded task.

Launched by tests/training/distributed/launch.py (2 ranks: DDP, or DeepSpeed ZeRO-2/3 with `--lora`). "Hard" prompts
are never right, so their level's hint grows from the second step; 3 groups of 4 per generation batch (6 rows a rank),
so a group spans both ranks. Each rank writes its log history, the hint lengths after every step, the hints its
reward function saw and a weight fingerprint.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from grpo_hub import GRPOHubTrainer
from grpo_hub.tasks import build_tiny_model
from tests.training.distributed.worker_common import (
    end_ranks,
    single_run_config,
    single_run_parser,
    weight_fingerprint,
    write_rank_result,
)
from tests.training.selective.graded import KINDS, graded_dataset, graded_reward

NUM_GENERATIONS = 4
ROWS_PER_RANK = 6  # 3 groups per generation batch, 6 + 6 rows: groups span both ranks


def main() -> None:
    parser = single_run_parser(__doc__, max_steps=6)
    parser.add_argument("--lora", action="store_true")
    args: argparse.Namespace = parser.parse_args()
    config = single_run_config(
        args, per_device_train_batch_size=ROWS_PER_RANK, num_generations=NUM_GENERATIONS, max_completion_length=12,
        hint_column="solution", hint_group_column="kind", hint_window=4,
    )  # fmt: skip
    dataset = graded_dataset(120)
    dataset = dataset.add_column("kind", [KINDS[i % 4] for i in range(len(dataset))])
    dataset = dataset.add_column("solution", [f"{i}\n{i + 1}\n{i + 2}" for i in range(len(dataset))])
    seen: list[list[str]] = []

    def reward(prompts, completions, completion_ids, hint, **kwargs):
        seen.append(list(hint))
        return graded_reward(prompts, completions, completion_ids)

    peft = None
    if args.lora:
        from peft import LoraConfig

        peft = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    trainer = GRPOHubTrainer(
        model=build_tiny_model(), reward_funcs=[reward], args=config, train_dataset=dataset, peft_config=peft
    )
    lengths: list[dict] = []
    record = trainer._hints.record

    def record_and_note(inputs, rewards_per_func):
        record(inputs, rewards_per_func)
        lengths.append({str(k): v for k, v in sorted(trainer._hints.lengths.items())})

    trainer._hints.record = record_and_note
    trainer.train()
    write_rank_result(
        trainer,
        Path(args.result_dir),
        lengths=lengths,
        hints_seen=seen,
        param_fingerprint=weight_fingerprint(p for p in trainer.model.parameters() if p.requires_grad),
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
    end_ranks()
