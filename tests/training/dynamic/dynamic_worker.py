"""Worker for the 2-rank dynamic-sampling test: GRPOHubTrainer with dynamic sampling, rank<k>.json per rank.

Launched by tests/training/distributed/launch.py under accelerate's cpu-ddp.yaml (2 gloo ranks). Only one prompt in
`--live-every` has a graded reward, so most groups are zero-signal and every step needs refill rounds. Each
rank records its own log history (the dynamic/* metrics it computed), the prompts its reward function
scored, and a fingerprint of its weights.
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
from tests.training.dynamic.degenerate import degenerate_dataset, mostly_flat_reward

NUM_GENERATIONS = 4
ROWS_PER_RANK = 8  # 2 groups per rank and generation batch: 4 groups in all


def main() -> None:
    parser = single_run_parser(__doc__, max_steps=3)
    parser.add_argument("--live-every", type=int, default=4)
    args = parser.parse_args()
    config = single_run_config(
        args,
        per_device_train_batch_size=ROWS_PER_RANK,
        num_generations=NUM_GENERATIONS,
        dynamic_sampling=True,
        dynamic_sampling_max_rounds=8,
    )
    scored: list[int] = []

    def reward(prompts, completions, completion_ids, index, **kwargs):
        scored.extend(index[::NUM_GENERATIONS])
        return mostly_flat_reward(prompts, completions, completion_ids)

    trainer = GRPOHubTrainer(
        model=build_tiny_model(),
        reward_funcs=[reward],
        args=config,
        train_dataset=degenerate_dataset(400, args.live_every),
    )
    trainer.train()
    write_rank_result(
        trainer,
        Path(args.result_dir),
        scored_prompts=scored,
        param_fingerprint=weight_fingerprint(trainer.model.parameters()),
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
    end_ranks()
