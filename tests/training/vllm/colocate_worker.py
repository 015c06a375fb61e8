"""Worker run by /opt/vllm-env's python (or `accelerate launch` for 2 ranks): short GRPOHubTrainer runs with vLLM
in colocate mode on CPU, one after the other in this one process (the imports and the first engine start are
most of a run's time; each later run builds its own trainer and engine). Writes `<result-dir>/<name>/rank<k>.json`
per run with the log history, the world size, the engine dtype and a checksum of the trained weights.

    python tests/training/vllm/colocate_worker.py --result-dir DIR \
        --runs '{"agilerl": {"vllm_is_preset": "agilerl"}, "lora": {"lora_r": 16}}'

A run's JSON holds GRPOHubConfig overrides, plus `lora_r`: train a LoRA adapter of this rank (absent: full model).
"""

import argparse
import gc
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
    parser.add_argument("--runs", required=True, help="JSON: {run name: GRPOHubConfig overrides (+ lora_r)}")
    return parser.parse_args()


def train(model_dir: str, output_dir: Path, overrides: dict) -> dict:
    """One run with `overrides`; the result dict of this rank."""
    import torch

    from grpo_hub import GRPOHubConfig, GRPOHubTrainer
    from grpo_hub.tasks import DEFAULT_TASK, get_reward_funcs, load_task_dataset

    overrides = dict(overrides)
    lora_r = overrides.pop("lora_r", 0)
    args = GRPOHubConfig(**{**BASE_CONFIG, "output_dir": str(output_dir), **overrides})
    peft_config = None
    if lora_r:
        from peft import LoraConfig

        peft_config = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules="all-linear")
    trainer = GRPOHubTrainer(
        model=model_dir,
        peft_config=peft_config,
        reward_funcs=get_reward_funcs(DEFAULT_TASK),
        args=args,
        train_dataset=load_task_dataset(DEFAULT_TASK, n=32, seed=0),
    )
    trainer.train()
    return {
        "rank": trainer.accelerator.process_index,
        "world_size": trainer.accelerator.num_processes,
        "engine_dtype": str(trainer.vllm_generation.llm.llm_engine.model_config.dtype),
        "weight_checksum": sum(p.detach().double().abs().sum().item() for p in trainer.model.parameters()),
        "threads": torch.get_num_threads(),
        "log_history": trainer.state.log_history,
    }


def main():
    from grpo_hub.tasks import build_tiny_model

    cli = parse_args()
    model_dir = build_tiny_model()
    for name, overrides in json.loads(cli.runs).items():
        run_dir = Path(cli.result_dir, name)
        run_dir.mkdir(parents=True, exist_ok=True)
        result = train(model_dir, run_dir / "out", overrides)
        (run_dir / f"rank{result['rank']}.json").write_text(json.dumps(result))
        gc.collect()  # the finished run's engine and its KV cache


if __name__ == "__main__":
    main()
