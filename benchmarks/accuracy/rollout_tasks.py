"""Tasks of the selective rollout benchmark: prompts, reward, held-out accuracy, model and hyperparameters.

`synthetic`: the digits task on the offline tiny model where, of every 4 prompts, 2 are graded (digit fraction,
learnable), 1 always gets reward 1 (an all-max group) and 1 always gets 0 (an all-min group).
`arithmetic`: the reasoning task (`grpo_hub.tasks.arithmetic`) on the offline arithmetic model with the LoRA
hyperparameters of `recipes/configs/arithmetic.yaml`; held-out accuracy is its greedy accuracy on 50 held-out
problems per level.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from peft import LoraConfig

from benchmarks.common import SMOKE_SETTINGS
from grpo_hub.tasks import (
    arithmetic,
    build_arithmetic_model,
    build_tiny_model,
    digit_fraction_reward,
    load_task_dataset,
)

HELD_OUT_SAMPLES = 4  # synthetic task: sampled completions per held-out prompt


@dataclass
class Task:
    """What a benchmark run needs besides the configuration under test.

    `reward(prompts, completions, **columns)`; `is_graded(prompt)`: the prompt's reward is learnable (the
    synthetic task's fixed-reward prompts are not); `accuracy(model, tokenizer, seed)`: held-out accuracy;
    `args`: GRPOConfig hyperparameters; `prompts` x `epochs`: the default prompt budget.
    """

    train: Dataset
    reward: Callable
    is_graded: Callable
    accuracy: Callable
    build_model: Callable[[], str]
    args: dict
    prompts: int
    epochs: int
    peft: LoraConfig | None = None
    notes: list[str] = field(default_factory=list)


def synthetic_task(n_train: int | None = None) -> Task:
    """Digits prompts; of every 4, two graded, one always solved (reward 1), one never solved (reward 0)."""
    n_train = n_train or 48
    n_held_out = 16
    prompts = load_task_dataset("digits", n=n_train + n_held_out, seed=0)["prompt"]
    kinds = ("Write only digits:", "Write only digits:", "Easy:", "Hard:")
    train = [kinds[i % 4] + p[len(kinds[0]) :] for i, p in enumerate(prompts[:n_train])]
    held_out = prompts[n_train:]

    def reward(prompts, completions, **kwargs):
        graded = digit_fraction_reward(prompts, completions)
        return [
            1.0 if p.startswith("Easy") else 0.0 if p.startswith("Hard") else r
            for p, r in zip(prompts, graded, strict=True)
        ]

    @torch.no_grad()
    def accuracy(model, tokenizer, seed: int) -> float:
        """Mean task reward of HELD_OUT_SAMPLES sampled completions per held-out prompt."""
        torch.manual_seed(seed)
        rows = [p for p in held_out for _ in range(HELD_OUT_SAMPLES)]
        side, tokenizer.padding_side = tokenizer.padding_side, "left"
        batch = tokenizer(rows, return_tensors="pt", padding=True).to(model.device)
        tokenizer.padding_side = side
        model.eval()
        out = model.generate(**batch, max_new_tokens=SMOKE_SETTINGS["max_completion_length"], do_sample=True)
        completions = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        rewards = reward(rows, completions)
        return sum(rewards) / len(rewards)

    args = {
        k: SMOKE_SETTINGS[k]
        for k in ("num_generations", "per_device_train_batch_size", "max_completion_length", "beta")
    }
    return Task(
        train=Dataset.from_dict({"prompt": train}),
        reward=reward,
        is_graded=lambda p: p.startswith(kinds[0]),
        accuracy=accuracy,
        build_model=build_tiny_model,
        args={**args, "learning_rate": 1e-2},
        prompts=n_train,
        epochs=8,
        notes=["offline tiny model, full fine-tuning, lr 1e-2, batch 16 = 4 groups of 4"],
    )


def arithmetic_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """The recipe's two rewards summed (correctness 1.0 + bare-integer format 0.1): what TRL sums with weights 1."""
    right = arithmetic.arithmetic_correctness_reward(prompts, completions, answer)
    form = arithmetic.arithmetic_format_reward(prompts, completions)
    return [r + f for r, f in zip(right, form, strict=True)]


def arithmetic_task(n_train: int | None = None) -> Task:
    """The arithmetic task with the LoRA settings of recipes/configs/arithmetic.yaml (8 prompts x 8 completions)."""
    n_train = n_train or 512

    def accuracy(model, tokenizer, seed: int) -> float:
        return arithmetic.evaluate(model, tokenizer, "heldout")["greedy"]["all"]

    return Task(
        train=arithmetic.load_arithmetic("train", n=n_train, seed=0),
        reward=arithmetic_reward,
        is_graded=lambda p: True,
        accuracy=accuracy,
        build_model=build_arithmetic_model,
        args={
            "learning_rate": 2e-3,
            "num_generations": 8,
            "per_device_train_batch_size": 64,
            "max_completion_length": 8,
            "temperature": 1.0,
            "beta": 0.0,
            "loss_type": "dapo",
        },
        prompts=n_train,
        epochs=12,
        peft=LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
        ),
        notes=[
            "offline arithmetic model, LoRA r16 lr 2e-3 (recipes/configs/arithmetic.yaml), batch 64 = 8 groups of 8",
            "held-out accuracy: greedy, 50 held-out problems per level",
        ],
    )


TASKS = {"synthetic": synthetic_task, "arithmetic": arithmetic_task}
