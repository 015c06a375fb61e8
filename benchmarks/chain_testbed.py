"""The chain testbed of the benchmarks that train the main job (time to accuracy, the wall clock, padding-free): a
recipe YAML's settings as `GRPOConfig` fields and its LoRA config (`recipe_settings`), the part of them plain TRL runs
(`plain_trl`), and plain TRL's or grpo_hub's trainer on the chain task's training problems (`chain_trainer`).
"""

import dataclasses

import torch
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.config.config_files import read_config
from grpo_hub.tasks import chain
from grpo_hub.tasks.chain_model import chain_model_path

LORA_KEYS = {"lora_r": "r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout"}
RECIPE_ONLY = {"task", "use_peft", "lora_target_modules", "logging_steps", "output_dir"}
GRPO_HUB_FIELDS = {f.name for f in dataclasses.fields(GRPOHubConfig)} - {
    f.name for f in dataclasses.fields(GRPOConfig)
}


def plain_trl(fields: dict) -> dict:
    """`fields` without the settings grpo_hub adds: what plain TRL's `GRPOConfig` runs of a recipe (a recipe's
    grpo_hub features, e.g. padding_free, are grpo_hub's)."""
    return {k: v for k, v in fields.items() if k not in GRPO_HUB_FIELDS}


def recipe_settings(path: str) -> tuple[dict, LoraConfig | None]:
    """(GRPOConfig fields, LoRA config or None for full fine-tuning) of a recipe YAML (its `base:` followed); the
    recipe's own keys are left out."""
    settings = read_config(path)
    fields = {k: v for k, v in settings.items() if k not in RECIPE_ONLY and k not in LORA_KEYS}
    if not settings.get("use_peft", True):  # the recipe's default (recipes/grpo.py: recipe_defaults)
        return fields, None
    lora = LoraConfig(
        task_type="CAUSAL_LM",
        target_modules=settings.get("lora_target_modules", "all-linear"),
        **{LORA_KEYS[k]: settings[k] for k in LORA_KEYS if k in settings},
    )
    return fields, lora


def chain_trainer(args, meter, lora, prompts: int, seed: int):
    """Plain TRL's trainer (a `GRPOConfig`) or grpo_hub's (a `GRPOHubConfig`) on the chain task's first `prompts`
    training problems, rewarded and metered by `meter` (its `reward`, `attach`), without the console printer."""
    model_dir = chain_model_path()
    torch.manual_seed(seed)
    trainer = (GRPOHubTrainer if isinstance(args, GRPOHubConfig) else GRPOTrainer)(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[meter.reward],
        args=args,
        train_dataset=chain.load_chain("train", n=prompts, seed=0),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=lora,
    )
    meter.attach(trainer)
    trainer.remove_callback(PrinterCallback)
    return trainer
