"""Worker for the 2-rank selective-rollout test: GRPOHubTrainer with selective rollout and dynamic sampling.

Launched by tests/training/distributed/launch.py under accelerate's cpu-ddp.yaml (2 gloo ranks). Prompt texts repeat
every 20 rows of the graded task, so the history predicts zero-signal prompts within the first epoch. Each rank
writes its log history, its skip decisions, the prompts its reward function scored and a weight fingerprint.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from graded import graded_dataset, graded_reward  # sibling file: the script dir is on sys.path

from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.tasks import build_tiny_model

NUM_GENERATIONS = 4
ROWS_PER_RANK = 6  # 3 groups per generation batch, split 6 + 6 rows: the middle group spans both ranks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--result-dir", required=True)
    args = parser.parse_args()
    config = GRPOHubConfig(
        output_dir=str(Path(args.result_dir) / "out"),
        use_cpu=True,
        bf16=False,
        max_steps=args.max_steps,
        learning_rate=1e-3,
        per_device_train_batch_size=ROWS_PER_RANK,
        num_generations=NUM_GENERATIONS,
        max_completion_length=8,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        dynamic_sampling=True,
        selective_rollout=True,
    )
    scored: list[int] = []

    def reward(prompts, completions, completion_ids, index, **kwargs):
        scored.extend(index)
        return graded_reward(prompts, completions, completion_ids)

    trainer = GRPOHubTrainer(
        model=build_tiny_model(), reward_funcs=[reward], args=config, train_dataset=graded_dataset(400)
    )
    trainer.train()
    accelerator = trainer.accelerator
    result = {
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "distributed_type": str(accelerator.distributed_type),
        "global_step": trainer.state.global_step,
        "log_history": trainer.state.log_history,
        "decisions": list(trainer._selector.decisions),
        "scored_rows": scored,
        "param_fingerprint": sum(p.detach().double().abs().sum().item() for p in trainer.model.parameters()),
    }
    (Path(args.result_dir) / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
