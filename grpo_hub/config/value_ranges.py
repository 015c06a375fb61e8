"""The ranges of the numeric settings grpo_hub inherits (TRL's GRPOConfig and transformers' TrainingArguments,
TRL's ModelConfig), checked on the values given, before any model or dataset is loaded.

TRL, transformers, peft and torch refuse most of these values too, but later and in their own words: a traceback
ending in "`max_new_tokens` must be greater than 0" for `max_completion_length=-5`, or a run that trains to the
end on `beta=-1` (a negative KL weight rewards moving away from the reference). Each `Range` says what it allows
and why, and its error names the field the user set. grpo_hub's own fields keep their checks in their feature rows
(`grpo_hub.config.feature_checks`), the IS bounds theirs (`vllm_checks.check_is_bounds`). The table is generated
into docs/config-reference.md (`docs/gen_config_reference.py`, tested current).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import NamedTuple

from transformers.trainer_pt_utils import AcceleratorConfig

from grpo_hub.config.validation import conflict_error
from grpo_hub.errors import field_error

SEED_MAX = 2**32 - 1  # numpy's seed range, which transformers' set_seed feeds


class Range(NamedTuple):
    """`low <= value <= high` (`<` where `open_low` / `open_high`), or one of `also`; None (where the field
    takes None) always passes."""

    field: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    also: tuple = ()
    why: str = ""

    def contains(self, value) -> bool:
        if value in self.also:
            return True
        above = self.low is None or (value > self.low if self.open_low else value >= self.low)
        below = self.high is None or (value < self.high if self.open_high else value <= self.high)
        return above and below

    def describe(self) -> str:
        """'> 0', '>= 1', 'in (0, 1]', '>= 1 or -1'."""
        if self.low is not None and self.high is not None:
            text = (
                f"in {'(' if self.open_low else '['}{self.low}, {self.high}{')' if self.open_high else ']'}"
            )
        elif self.low is not None:
            text = f"{'>' if self.open_low else '>='} {self.low}"
        else:
            text = f"{'<' if self.open_high else '<='} {self.high}"
        return text + "".join(f" or {value}" for value in self.also)

    def example(self):
        """A value inside the range, for the fix."""
        if self.low is None:
            return self.high
        if self.high is not None and self.open_low:
            return (self.low + self.high) / 2
        return self.low + 1 if self.open_low else self.low


def _count(name: str, low: int = 1, why: str = "") -> Range:
    return Range(name, low, why=why)


TRAINING_RANGES = (  # TrainingArguments
    _count("per_device_train_batch_size"),
    _count("per_device_eval_batch_size"),
    _count("gradient_accumulation_steps"),
    _count("eval_accumulation_steps"),
    _count("save_total_limit", why="0 would delete every checkpoint; None keeps them all"),
    _count("torch_empty_cache_steps"),
    _count("dataloader_prefetch_factor"),
    Range("dataloader_num_workers", 0),
    Range("num_train_epochs", 0, open_low=True),
    Range("max_steps", 1, also=(-1,), why="-1 trains num_train_epochs"),
    Range("learning_rate", 0, why="a negative rate climbs the loss; 0 is the control run"),
    Range("warmup_steps", 0),
    Range("weight_decay", 0),
    Range("adam_beta1", 0, 1, open_high=True),
    Range("adam_beta2", 0, 1, open_high=True),
    Range("adam_epsilon", 0, open_low=True),
    Range("max_grad_norm", 0, why="0 turns clipping off"),
    Range("logging_steps", 0, open_low=True),
    Range("save_steps", 0, open_low=True),
    Range("eval_steps", 0, open_low=True),
    Range("eval_delay", 0),
    Range("seed", 0, SEED_MAX, why="numpy's seed range"),
    Range("data_seed", 0, SEED_MAX, why="numpy's seed range"),
    Range("ddp_timeout", 0, open_low=True),
)
GENERATION_RANGES = (  # TRL's GRPOConfig
    _count("num_generations", 2, why="GRPO compares the completions of a group"),
    _count("num_generations_eval", why="evaluation needs no group (TRL's own tests evaluate with 1)"),
    _count("max_completion_length"),
    _count("generation_batch_size"),
    _count("steps_per_generation"),
    _count("num_iterations"),
    _count("ref_model_sync_steps"),
    Range("num_completions_to_print", 0),
    Range("max_tool_calling_iterations", 0),
    Range("temperature", 0, open_low=True, why="TRL always samples, and sampling divides the logits by it"),
    Range("top_p", 0, 1, open_low=True),
    Range("top_k", 0, also=(-1,), why="0, and vLLM's -1, turn top-k off"),
    Range("min_p", 0, 1),
    Range("repetition_penalty", 0, open_low=True),
    Range("beta", 0, why="a negative KL weight rewards moving away from the reference"),
    Range("ref_model_mixup_alpha", 0, 1),
    Range("top_entropy_quantile", 0, 1),
    Range("vllm_gpu_memory_utilization", 0, 1, open_low=True),
    Range("vllm_server_port", 1, 65535),
    Range("vllm_group_port", 1, 65535),
    Range("vllm_server_timeout", 0, open_low=True),
    Range("vllm_max_model_length", 1),
    Range("vllm_tensor_parallel_size", 1),
)
CONFIG_RANGES = TRAINING_RANGES + GENERATION_RANGES
NON_EMPTY = {  # string settings that name something: an empty one is a mistake (None is "unset")
    "output_dir": "folder",
    "resume_from_checkpoint": "checkpoint folder",
    "hub_model_id": "repo id",
    "vllm_server_base_url": "URL",
    "vllm_server_sync_dir": "folder",
    "model_name_or_path": "model id or folder",
    "dataset_name": "dataset id or folder",
}
RECIPE_RANGES = (  # the recipe's RecipeArguments
    Range("num_prompts", 1),
    Range("dataset_seed", 0, SEED_MAX, why="numpy's seed range"),
    Range("eval_pass_k", 0, why="0 reports greedy accuracy only"),
    Range("eval_per_level", 1),
)
MODEL_RANGES = (  # TRL's ModelConfig, read by the recipe
    _count("lora_r"),
    Range("lora_alpha", 0, open_low=True),
    Range("lora_dropout", 0, 1, open_high=True),
)


def check_ranges(settings, ranges=CONFIG_RANGES) -> None:
    """Raise the field error of the first number in `settings` outside its range (other types are left to the
    type checks, None means off or default)."""
    for rule in ranges:
        value = getattr(settings, rule.field)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and not (math.isfinite(value) and rule.contains(value)):
            why = f" ({rule.why})" if rule.why else ""
            field_error(
                rule.field,
                f"must be {rule.describe()}{why}, got {value}.",
                f"set {rule.field} {rule.describe()}, e.g. {rule.example()}.",
            )


def check_non_empty(settings) -> None:
    """Raise for an empty or blank string in a `NON_EMPTY` setting that `settings` has."""
    for name, what in NON_EMPTY.items():
        value = getattr(settings, name, None)
        if isinstance(value, str) and not value.strip():
            field_error(name, "is empty.", f"give a {what}, or leave {name} unset.")


def check_pad_to_multiple_of(value) -> None:
    """TRL's `pad_to_multiple_of`: 'auto', None ('none' / 'null' from the command line) or a positive integer (TRL
    reads a string with int(), whose error names no field)."""
    if value is None or value == "auto" or (isinstance(value, str) and value.lower() in ("none", "null")):
        return
    text = str(value)
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        field_error(
            "pad_to_multiple_of",
            f"must be 'auto', None or an integer >= 1, got {value!r}.",
            "e.g. 8, or 'auto'.",
        )


# transformers reads a string in these as the path of a JSON file
FILE_SETTINGS = ("accelerator_config", "fsdp_config", "deepspeed")


def check_dict_settings(c) -> None:
    """transformers' dict settings given as text (`_VALID_DICT_FIELDS`): a JSON object, or for `FILE_SETTINGS` the path
    of an existing JSON file (transformers opens it later, and its OSError names no field)."""
    for name in c._VALID_DICT_FIELDS:
        value = getattr(c, name)
        if isinstance(value, str) and value.startswith("{"):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                field_error(
                    name, f"is not valid JSON ({error}).", "write a JSON object, e.g. '{\"key\": 1}'."
                )
        if isinstance(value, dict) and name == "accelerator_config":
            known = {f.name for f in dataclasses.fields(AcceleratorConfig)}
            if set(value) - known:
                field_error(
                    name,
                    f"has unknown keys {sorted(map(str, set(value) - known))}.",
                    f"use keys of {sorted(known)}.",
                )
        if isinstance(value, str) and name not in FILE_SETTINGS:
            field_error(
                name, f"must be a mapping or a JSON object, got {value!r}.", "write e.g. '{\"key\": 1}'."
            )
        if isinstance(value, str) and not os.path.isfile(value):
            field_error(name, f"names no file: {value!r}.", "give the path of a JSON file, or a JSON object.")


HUB_ID = re.compile(r"^[A-Za-z0-9_][\w.-]*(/[\w.-]*[\w])?$")  # 'Qwen/Qwen2.5-0.5B'; a path starts otherwise


def check_model_source(model: str | None) -> None:
    """A `model_name_or_path` that cannot be a Hub id must be an existing folder (a typo in a path would otherwise
    end in the Hub client's repo-id error)."""
    if model is not None and not HUB_ID.match(model) and not os.path.isdir(os.path.expanduser(model)):
        field_error(
            "model_name_or_path",
            f"{model!r} is no folder (and no Hub id).",
            "give a model folder or a Hub id.",
        )


def check_model_choices(model_args) -> None:
    """ModelConfig's text settings that peft and transformers read only once the model is loaded."""
    from peft import TaskType
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    task_types = [t.value for t in TaskType]
    if model_args.lora_task_type not in task_types:
        field_error(
            "lora_task_type",
            f"{model_args.lora_task_type!r} is not a peft task type.",
            f"use one of {task_types}.",
        )
    kernels = ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]
    implementation = model_args.attn_implementation
    hub_kernel = isinstance(implementation, str) and "/" in implementation  # e.g. kernels-community/...
    if implementation is not None and implementation not in kernels and not hub_kernel:
        field_error(
            "attn_implementation", f"{implementation!r} is not an attention kernel.", f"use one of {kernels}."
        )


def launched_processes() -> int:
    """The number of training processes the launcher (accelerate, torchrun) announced; 1 without one."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_groups_fit(c, processes: int) -> None:
    """Every generation batch holds whole groups of num_generations completions (TRL checks it after building the
    batch sizes, naming `generation_batch_size` even where the user set only `per_device_train_batch_size`).
    Values of another type are left to TRL."""
    sizes = (c.per_device_train_batch_size, c.gradient_accumulation_steps, c.num_generations)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes):
        return
    if c.generation_batch_size is not None and c.steps_per_generation is not None:
        conflict_error(
            "generation_batch_size",
            "steps_per_generation",
            "each one sets the other.",
            "set only one of them.",
        )
    per_step = c.per_device_train_batch_size * processes
    if c.generation_batch_size is not None:
        batch, name = c.generation_batch_size, "generation_batch_size"
        fix = f"set generation_batch_size to a multiple of {math.lcm(per_step, c.num_generations)}"
        if batch % per_step:
            field_error(
                name,
                f"{batch} is not a whole number of optimizer micro-batches of per_device_train_batch_size x "
                f"{processes} process(es) = {per_step}.",
                f"{fix}.",
            )
    else:
        unit = processes * (c.steps_per_generation or c.gradient_accumulation_steps)
        batch, name = c.per_device_train_batch_size * unit, "per_device_train_batch_size"
        fits = c.num_generations // math.gcd(c.num_generations, unit)
        fix = f"set per_device_train_batch_size to a multiple of {fits}"
    if batch % c.num_generations:
        field_error(
            name,
            f"a generation batch of {batch} completions does not split into groups of num_generations = "
            f"{c.num_generations}.",
            f"{fix}, or num_generations to a divisor of {batch}.",
        )
    if c.eval_strategy != "no":  # transformers turns do_eval on with it
        groups = c.num_generations_eval or c.num_generations
        eval_batch = c.per_device_eval_batch_size * processes
        if eval_batch % groups:
            field_error(
                "per_device_eval_batch_size",
                f"an evaluation batch of {eval_batch} completions does not split into groups of {groups}.",
                f"set per_device_eval_batch_size to a multiple of {groups // math.gcd(groups, processes)}.",
            )


def check_recipe_settings(recipe_args, model_args) -> None:
    """A recipe's own settings and TRL's `ModelConfig`: no empty string in either, the model's ranges, its source
    and its choices."""
    check_ranges(model_args, MODEL_RANGES)
    for settings in (recipe_args, model_args):
        check_non_empty(settings)
    check_model_source(model_args.model_name_or_path)
    check_model_choices(model_args)
