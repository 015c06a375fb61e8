"""Tiny offline GRPO runs for the reference-adapter tests: local tiny Qwen2, LoRA, in-code dataset."""

from __future__ import annotations

import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from grpo_hub.tasks.tiny_model import build_tiny_model
from grpo_hub.training.reference import REF_ADAPTER, paired_parameters

PROMPTS = [
    "write the letter a",
    "count to three",
    "repeat b b b",
    "say many times c",
    "copy 42",
    "digits only 7",
]


def char_code_reward(completions, **kwargs):
    """Reward = mean character code / 128: differs between almost any two completions, so every step learns."""
    return [sum(map(ord, c)) / (128 * max(len(c), 1)) for c in completions]


def prompt_dataset(n_rows: int = 24) -> Dataset:
    """Fixed prompt dataset cycling through PROMPTS."""
    return Dataset.from_dict({"prompt": [PROMPTS[i % len(PROMPTS)] for i in range(n_rows)]})


def lora_config() -> LoraConfig:
    """LoRA on the attention projections of the tiny model."""
    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def tiny_tokenizer():
    """Tokenizer of the tiny local model, left-padded for generation."""
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    tokenizer.padding_side = "left"
    return tokenizer


def tiny_peft_model(seed: int = 0):
    """Tiny Qwen2 wrapped in a fresh LoRA adapter named "default"."""
    torch.manual_seed(seed)
    return get_peft_model(AutoModelForCausalLM.from_pretrained(build_tiny_model()), lora_config())


def grpo_args(output_dir: str, config_cls: type[GRPOConfig] = GRPOConfig, **overrides) -> GRPOConfig:
    """CPU `config_cls` (GRPOConfig or a subclass) for a few fast deterministic steps: 4 prompts x 4
    generations x 8 tokens per step."""
    values = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        learning_rate=5e-2,
        beta=0.1,
        max_steps=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    values.update(overrides)
    return config_cls(**values)


def adapter_tensors(model, adapter: str) -> dict[str, torch.Tensor]:
    """Detached copies of one adapter's tensors keyed by the REF name (so both adapters share keys)."""
    pairs = paired_parameters(model, "default", REF_ADAPTER)
    index = 1 if adapter == "default" else 2
    return {pair[0]: pair[index].detach().clone() for pair in pairs}
