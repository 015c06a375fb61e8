"""The run record: what a model card and a Hub push need to know about a training run, in one JSON file.

`run_record(args, log_history, step, base_model)` keeps the config fields that differ from the config class's
defaults (bookkeeping and token-like fields dropped), the loss variant, the step, the base model and the
logged rewards; `GRPOHubTrainer.save_model` writes it as `grpo_run.json` next to the adapter, so a folder
pushed later (`grpo-hub push`) carries it. `read_run_record(folder)` reads it back, falling back to the
trainer's `trainer_state.json` (a checkpoint) or the recipe's `run_summary.json`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

from grpo_hub.algos import loss_types

RUN_RECORD = "grpo_run.json"
RUN_SUMMARY = "run_summary.json"  # written by recipes/grpo.py: its `rewards` list is one entry per step
# Fields that say where and how the run was bookkept, not what it trained: never on a card.
BOOKKEEPING = frozenset(
    {
        "output_dir",
        "logging_dir",
        "run_name",
        "report_to",
        "push_to_hub",
        "hub_model_id",
        "hub_strategy",
        "hub_private_repo",
        "resume_from_checkpoint",
        "use_cpu",
        "disable_tqdm",
        "logging_steps",
        "logging_strategy",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "model_init_kwargs",
        "overwrite_output_dir",
        "dataloader_num_workers",
    }
)
# Per-step log keys kept in the record (the reward curve and the final metrics read them).
LOG_KEYS = (
    "step",
    "reward",
    "reward_std",
    "kl",
    "loss",
    "frac_reward_zero_std",
    "train_runtime",
    "train_loss",
)
LOG_PREFIXES = ("rewards/", "hints/")  # every reward function's and the hints' per-step logs


def loss_variant(config: Mapping) -> str:
    """The loss-type entry a recorded (resolved) config trains (`loss_types.variant_name`): gspo for sequence-level
    grpo ratios, else its loss_type."""
    return loss_types.variant_name(
        str(config.get("loss_type") or "grpo"), config.get("importance_sampling_level")
    )


def _plain(value):
    """`value` if JSON can hold it as a scalar or a list of scalars, else None (dropped)."""
    if isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, str | int | float | bool) for v in value):
        return list(value)
    if hasattr(value, "value") and isinstance(value.value, str):  # enums such as IntervalStrategy
        return value.value
    return None


def _reference_values(args) -> dict:
    """Field values of a default-constructed config of the same class (so values its __post_init__ derives,
    like `epsilon` or `steps_per_generation`, count as defaults); the declared defaults if that fails.

    Built so that the live run is untouched: TrainingArguments.__post_init__ would otherwise reset the
    accelerate state and, under `accelerate launch` with DeepSpeed (ACCELERATE_USE_DEEPSPEED), install a
    default DeepSpeed config globally, after which this rank no longer knows it runs ZeRO-3.
    """
    import os
    import warnings

    from accelerate.state import PartialState

    kwargs = {"output_dir": args.output_dir, "use_cpu": args.use_cpu, "bf16": args.bf16}
    if PartialState._shared_state:  # a run is live: building TrainingArguments must not reset its state
        kwargs["accelerator_config"] = {"use_configured_state": True}
    use_deepspeed = os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reference = type(args)(**kwargs)
        return {f.name: getattr(reference, f.name, None) for f in dataclasses.fields(args)}
    except Exception:  # a config class that cannot be built bare: compare with the declared defaults
        return {f.name: f.default for f in dataclasses.fields(args)}
    finally:
        if use_deepspeed is not None:
            os.environ["ACCELERATE_USE_DEEPSPEED"] = use_deepspeed


def changed_fields(args) -> dict:
    """Fields of a config dataclass that differ from its class defaults, minus bookkeeping and tokens."""
    reference, out = _reference_values(args), {}
    for field in dataclasses.fields(args):
        name = field.name
        if name in BOOKKEEPING or "token" in name.lower() or name.startswith("_"):
            continue
        value, default = _plain(getattr(args, name, None)), _plain(reference.get(name))
        if value not in (None, "", []) and value != default:
            out[name] = value
    return dict(sorted(out.items()))


def run_record(args, log_history: list[dict], step: int | None, base_model: str | None) -> dict:
    """The record of a run: non-default config, loss variant, step, base model and the logged rewards."""
    return {
        "base_model": base_model,
        "step": step,
        "loss_variant": loss_variant(vars(args)) if args is not None else None,
        "config": changed_fields(args) if args is not None else {},
        "log_history": [
            {k: v for k, v in entry.items() if k in LOG_KEYS or k.startswith(LOG_PREFIXES)}
            for entry in log_history
            if "reward" in entry or "train_runtime" in entry
        ],
    }


def write_run_record(folder: str | Path, record: dict) -> Path:
    """Write `record` as `folder/grpo_run.json`; returns the path."""
    path = Path(folder) / RUN_RECORD
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def _newest_checkpoint_first(folder: Path) -> list[Path]:
    checkpoints = [p for p in folder.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return [folder, *sorted(checkpoints, key=lambda p: -int(p.name.split("-")[-1]))]


def read_run_record(folder: str | Path) -> dict:
    """The run record of a saved folder: grpo_run.json, else trainer_state.json, else run_summary.json.

    Each is looked up in `folder`, then in its newest checkpoint-<N>; an empty record when none exists.
    """
    root = Path(folder)
    for candidate in _newest_checkpoint_first(root):
        if (candidate / RUN_RECORD).is_file():
            return json.loads((candidate / RUN_RECORD).read_text())
    for candidate in _newest_checkpoint_first(root):
        if (candidate / "trainer_state.json").is_file():
            state = json.loads((candidate / "trainer_state.json").read_text())
            return run_record(None, state.get("log_history", []), state.get("global_step"), None)
    if (root / RUN_SUMMARY).is_file():
        summary = json.loads((root / RUN_SUMMARY).read_text())
        history = [{"step": i + 1, "reward": r} for i, r in enumerate(summary.get("rewards", []))]
        return run_record(None, history, summary.get("steps"), summary.get("model"))
    return run_record(None, [], None, None)
