"""Worker run by /opt/vllm-env's python (or `accelerate launch` for 2 ranks): a short GRPOHubTrainer run with
vLLM in colocate mode on CPU. Writes `<result-dir>/rank<k>.json` with the log history, the world size, the
engine dtype and a checksum of the trained weights.

    python tests/training/vllm/colocate_worker.py --result-dir DIR --model-dir DIR --config '{"vllm_is_preset": "agilerl"}'
"""

import argparse
import json
from pathlib import Path

BASE_CONFIG = {
    "use_cpu": True,
    "bf16": False,
    "use_vllm": True,
    "vllm_mode": "colocate",
    "vllm_max_model_length": 128,
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 8,
    "learning_rate": 1e-2,
    "max_steps": 2,
    "logging_steps": 1,
    "seed": 0,
    "report_to": "none",
    "save_strategy": "no",
    "disable_tqdm": True,
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--result-dir", required=True)
    parser.add_argument(
        "--model-dir", required=True, help="built with grpo_hub.tasks.build_tiny_model if absent"
    )
    parser.add_argument("--config", default="{}", help="JSON overrides of GRPOHubConfig fields")
    parser.add_argument(
        "--lora-r", type=int, default=0, help="train a LoRA adapter of this rank (0: full model)"
    )
    return parser.parse_args()


def main():
    import torch

    from grpo_hub import GRPOHubConfig, GRPOHubTrainer
    from grpo_hub.tasks import DEFAULT_TASK, build_tiny_model, get_reward_funcs, load_task_dataset

    cli = parse_args()
    model_dir = build_tiny_model(output_dir=cli.model_dir)
    settings = {**BASE_CONFIG, "output_dir": str(Path(cli.result_dir) / "out"), **json.loads(cli.config)}
    args = GRPOHubConfig(**settings)
    peft_config = None
    if cli.lora_r:
        from peft import LoraConfig

        peft_config = LoraConfig(r=cli.lora_r, lora_alpha=2 * cli.lora_r, target_modules="all-linear")
    trainer = GRPOHubTrainer(
        model=model_dir,
        peft_config=peft_config,
        reward_funcs=get_reward_funcs(DEFAULT_TASK),
        args=args,
        train_dataset=load_task_dataset(DEFAULT_TASK, n=32, seed=0),
    )
    trainer.train()
    rank = trainer.accelerator.process_index
    checksum = sum(p.detach().double().abs().sum().item() for p in trainer.model.parameters())
    result = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "engine_dtype": str(trainer.vllm_generation.llm.llm_engine.model_config.dtype),
        "weight_checksum": checksum,
        "threads": torch.get_num_threads(),
        "log_history": trainer.state.log_history,
    }
    Path(cli.result_dir, f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
