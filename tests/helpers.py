"""Tiny-model GRPO configs and trainers for the single-process tests (local folder, no Hub access)."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from grpo_hub.config.hub_config import GRPOHubConfig
from grpo_hub.tasks import SMOKE_TASK, get_reward_funcs, load_task_dataset

CPU = {"use_cpu": True, "bf16": False, "report_to": "none", "save_strategy": "no", "disable_tqdm": True}


def tiny_config(tmp_path, config_cls: type[GRPOConfig] = GRPOHubConfig, **overrides) -> GRPOConfig:
    """A small, fast `config_cls` (GRPOHubConfig, or TRL's GRPOConfig for plain-TRL runs); `overrides` win."""
    settings = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 8,
        "learning_rate": 1e-2,
        "logging_steps": 1,
        "log_level": "error",
        "max_steps": 1,
        "seed": 0,
        **CPU,
        **overrides,
    }
    return config_cls(**settings)


def load_model(model_dir, seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)


def make_trainer(trainer_cls, model_dir, args, reward_funcs=None, dataset=None, **kwargs):
    """Trainer on the built-in task (or `dataset`/`reward_funcs`) with a freshly loaded tiny model."""
    model, tokenizer = load_model(model_dir)
    return trainer_cls(
        model=model,
        reward_funcs=reward_funcs or get_reward_funcs(SMOKE_TASK),
        args=args,
        train_dataset=dataset if dataset is not None else load_task_dataset(SMOKE_TASK, n=64, seed=0),
        processing_class=tokenizer,
        **kwargs,
    )


def half_signal_dataset(n: int = 32):
    """Alternating prompts: "Write only digits: ..." (graded) and "Stay quiet: ..." (constant reward 0), each with a
    three-step `solution` (the column hint-guided rollouts read: `hint_column="solution"`)."""
    from datasets import Dataset

    prompts = [f"Write only digits: {i % 10}" if i % 2 == 0 else f"Stay quiet: {i % 10}" for i in range(n)]
    return Dataset.from_dict({"prompt": prompts, "solution": [f"{i}\n{i + 1}\n{i + 2}" for i in range(n)]})


def half_signal_reward(prompts, completions, completion_ids, **kwargs):
    """0.0 for "Stay quiet" prompts (zero-signal groups); a completion-dependent value in [0, 1) otherwise."""
    return [
        0.0 if p.startswith("Stay") else (sum(ids) % 7) / 7
        for p, ids in zip(prompts, completion_ids, strict=True)
    ]


def constant_reward(prompts, completions, **kwargs):
    """Reward 1 for every completion: every group is zero-signal."""
    return [1.0] * len(completions)


def step_logs(run) -> list[dict]:
    """The per-step log entries (those with a loss; TRL's final summary has none) of a trainer, or of a worker's
    rank result dict (`log_history`, `global_step`: tests/training/distributed/worker_common.py); one per step."""
    history, steps = (
        (run["log_history"], run["global_step"])
        if isinstance(run, dict)
        else (run.state.log_history, run.state.global_step)
    )
    logs = [entry for entry in history if "loss" in entry]
    assert len(logs) == steps, f"expected one log per step, got {len(logs)} for {steps} steps"
    return logs


def scored_batch(trainer, seed: int = 0) -> dict:
    """One generation batch (2 prompts x num_generations) scored by `trainer` in training mode; the same `seed`
    gives the same completions."""
    dataset = trainer.train_dataset
    inputs = [dataset[i] for i in range(2) for _ in range(trainer.num_generations)]
    torch.manual_seed(seed)
    trainer.model.train()
    return trainer._generate_and_score_completions(inputs)
