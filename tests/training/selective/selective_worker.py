"""Worker for the 2-rank selective-rollout test: GRPOHubTrainer with selective rollout (--mode) and dynamic sampling.

Launched by tests/training/distributed/launch.py under accelerate's cpu-ddp.yaml (2 gloo ranks). Prompt texts repeat
every 20 rows of the graded task, so the history predicts zero-signal prompts within the first epoch. Each rank
writes its log history, its skip decisions, the prompts its reward function scored and a weight fingerprint.
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
ROWS_PER_RANK = 6  # 3 groups per generation batch, split 6 + 6 rows: the middle group spans both ranks


def main() -> None:
    parser = single_run_parser(__doc__, max_steps=4)
    parser.add_argument("--mode", default="replace", help="selective_rollout_mode")
    args = parser.parse_args()
    config = single_run_config(
        args,
        per_device_train_batch_size=ROWS_PER_RANK,
        num_generations=NUM_GENERATIONS,
        dynamic_sampling=True,
        selective_rollout=True,
        selective_rollout_mode=args.mode,
    )
    scored: list[int] = []

    def reward(prompts, completions, completion_ids, index, **kwargs):
        scored.extend(index)
        return graded_reward(prompts, completions, completion_ids)

    trainer = GRPOHubTrainer(
        model=build_tiny_model(), reward_funcs=[reward], args=config, train_dataset=graded_dataset(400)
    )
    trainer.train()
    write_rank_result(
        trainer,
        Path(args.result_dir),
        decisions=list(trainer._selector.decisions),
        scored_rows=scored,
        param_fingerprint=weight_fingerprint(trainer.model.parameters()),
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
    end_ranks()
