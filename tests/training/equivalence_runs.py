"""Training runs of the equivalence suite (tests/training/test_equivalence.py): one batch layout, trained by plain
TRL or by grpo_hub with one promise's settings, ending in its trainable weights and logged rewards.

Used in-process (1 rank) and by distributed/equivalence_worker.py (2 gloo ranks). The data alternates graded
prompts with constant-reward ones, so half the groups are zero-signal and filtering has rows to drop; on 2 ranks
rank 1 gets only constant-reward prompts in every generation batch (`two_rank_kinds`), so it drops every row.
Optimizer: plain SGD, so equal gradients give equal weights to float precision (Adam's normalisation would turn
float noise in near-zero gradients into full-size steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from datasets import Dataset

from tests.helpers import half_signal_reward, load_model, tiny_config

ROWS_PER_MICRO_BATCH = 8  # 2 prompts x 4 generations per rank and micro-step
NUM_GENERATIONS = 4


@dataclass(frozen=True)
class Layout:
    """How rows fall into micro-batches and optimizer steps, with the model and reward set-up."""

    steps_per_generation: int
    gradient_accumulation_steps: int
    num_iterations: int
    reward_funcs: int  # 1 or 2
    peft: bool
    prompts_factor: int = 1  # more prompts than TRL reads, for a trainer that reads more (dynamic sampling)

    @property
    def name(self) -> str:
        kind = "lora" if self.peft else "full"
        return (
            f"S{self.steps_per_generation}-GA{self.gradient_accumulation_steps}-it{self.num_iterations}"
            f"-r{self.reward_funcs}-{kind}"
        )

    @property
    def max_steps(self) -> int:
        """Optimizer steps that cover two generation cycles (steps_per_generation x num_iterations micro-steps)
        or more, and at least 2."""
        cycle = self.steps_per_generation * self.num_iterations
        return max(2, math.ceil(2 * cycle / self.gradient_accumulation_steps))

    def fields(self) -> dict:
        return {
            "steps_per_generation": self.steps_per_generation,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "num_iterations": self.num_iterations,
            "max_steps": self.max_steps,
        }


def prompts_needed(layout: Layout, num_processes: int) -> int:
    """Prompts the run reads: prompts per generation batch x generation batches (rounded up)."""
    per_batch = ROWS_PER_MICRO_BATCH // NUM_GENERATIONS * layout.steps_per_generation * num_processes
    micro_steps = layout.max_steps * layout.gradient_accumulation_steps
    cycles = math.ceil(micro_steps / (layout.steps_per_generation * layout.num_iterations))
    return per_batch * cycles * layout.prompts_factor


def two_rank_kinds(layout: Layout, n_prompts: int) -> list[bool]:
    """Per prompt, True for a constant-reward prompt: on 2 ranks rank 1 reads only those, rank 0 alternates."""
    per_rank = ROWS_PER_MICRO_BATCH // NUM_GENERATIONS * layout.steps_per_generation
    return [(i // per_rank) % 2 == 1 or i % 2 == 1 for i in range(n_prompts)]


def dataset(layout: Layout, num_processes: int) -> Dataset:
    n = prompts_needed(layout, num_processes)
    quiet = two_rank_kinds(layout, n) if num_processes == 2 else [i % 2 == 1 for i in range(n)]
    prompts = [f"Stay quiet: {i % 10}" if q else f"Write only digits: {i % 10}" for i, q in enumerate(quiet)]
    solutions = [f"{i}\n{i + 1}" for i in range(n)]  # read only by hint-guided rollouts (hint_column)
    return Dataset.from_dict({"prompt": prompts, "solution": solutions})


def length_reward(prompts, completions, completion_ids, **kwargs):
    """A second reward function: 0 on "Stay quiet" prompts (so those groups stay zero-signal), else by length."""
    return [
        0.0 if p.startswith("Stay") else len(ids) % 3 / 3
        for p, ids in zip(prompts, completion_ids, strict=True)
    ]


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def train(
    trainer_kind: str,
    layout: Layout,
    settings: dict,
    output_dir,
    model_dir,
    num_processes: int = 1,
    vllm_is: dict | None = None,
):
    """Train `layout` with plain TRL (`trainer_kind` "trl") or GRPOHubTrainer ("hub") and the config `settings`;
    returns the trained trainer. `vllm_is`: run TRL's vLLM IS path through the stand-in sampler
    (tests/training/vllm_stand_in.py: `as_vllm_sampler`'s keyword arguments); the trainer's `scoring_forwards`
    then counts the no-grad policy forwards outside generation."""
    if trainer_kind == "trl":
        from trl import GRPOConfig as config_cls
        from trl import GRPOTrainer as trainer_cls
    else:
        from grpo_hub import GRPOHubConfig as config_cls
        from grpo_hub import GRPOHubTrainer as trainer_cls
    args = tiny_config(
        output_dir,
        config_cls,
        per_device_train_batch_size=ROWS_PER_MICRO_BATCH,
        num_generations=NUM_GENERATIONS,
        optim="sgd",
        learning_rate=0.2,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        **layout.fields(),
        **settings,
    )
    model, tokenizer = load_model(model_dir)
    trainer = trainer_cls(
        model=model,
        reward_funcs=[half_signal_reward, length_reward][: layout.reward_funcs],
        args=args,
        train_dataset=dataset(layout, num_processes),
        processing_class=tokenizer,
        peft_config=lora_config() if layout.peft else None,
    )
    if vllm_is is not None:
        from tests.training.vllm_stand_in import ScoringForwards, as_vllm_sampler

        trainer.scoring_forwards = ScoringForwards(trainer.model)
        as_vllm_sampler(trainer, trainer.scoring_forwards, **vllm_is)
    trainer.train()
    return trainer


def trained_weights(trainer) -> torch.Tensor:
    """The trainable weights as one flat float64 CPU tensor."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    return torch.cat([p.detach().double().reshape(-1).cpu() for p in params])


def logged_rewards(trainer) -> list[float]:
    """The mean reward of every generation batch (all ranks), as TRL logs it."""
    return [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
