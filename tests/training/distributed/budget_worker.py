"""Worker for the 2-rank rollout-budget test: GRPOHubTrainer with rollout_budget="knapsack" on the graded task.

Launched by tests/training/distributed/launch.py under accelerate's cpu-ddp.yaml (2 gloo ranks). Prompt texts repeat
every 20 rows of the graded task, so prompts have a history within the first epoch and the budgets differ. Each rank
writes its log history, the group sizes of every generation batch, the prompts its reward function scored and a
weight fingerprint.
"""

from __future__ import annotations

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
from tests.training.selective.graded import graded_dataset, graded_reward

NUM_GENERATIONS = 4
ROWS_PER_RANK = 6  # 3 groups per generation batch, 6 + 6 rows: groups span both ranks


def main() -> None:
    args = single_run_parser(__doc__, max_steps=8).parse_args()
    config = single_run_config(
        args,
        per_device_train_batch_size=ROWS_PER_RANK,
        num_generations=NUM_GENERATIONS,
        rollout_budget="knapsack",
    )
    scored: list[list[int]] = []

    def reward(prompts, completions, completion_ids, index, **kwargs):
        scored.append(list(index))
        return graded_reward(prompts, completions, completion_ids)

    trainer = GRPOHubTrainer(
        model=build_tiny_model(), reward_funcs=[reward], args=config, train_dataset=graded_dataset(400)
    )
    sizes: list[list[int]] = []
    assign = trainer._budgets.assign

    def assign_and_note(inputs):
        rows = assign(inputs)
        sizes.append(trainer._budgets.sizes)
        return rows

    trainer._budgets.assign = assign_and_note
    trainer.train()
    write_rank_result(
        trainer,
        Path(args.result_dir),
        sizes=sizes,
        scored_rows=scored,
        param_fingerprint=weight_fingerprint(trainer.model.parameters()),
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
    end_ranks()
