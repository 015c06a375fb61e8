"""Checks on what the user's data and reward functions hand the trainer, each raising before it can do harm.

- An empty prompt tokenizes to zero tokens and crashes inside `generate` (`Expected tensor for argument #1
  'indices'`, plain TRL too): a map-style dataset is scanned at start-up (error with the dataset row), and each
  batch is checked before generation (iterable datasets have no row index). A row or dataset with no "prompt" at
  all is TRL's environment-owned data when `environment_factory` is given (reset() supplies the prompt): accepted.
- A reward of +-inf (NaN and None mean "not scored" in TRL and are kept) turns the advantages, then the weights,
  into NaN: it is an error naming the reward function and the rows. Rewards arrive gathered over all ranks, so
  every rank raises together.
- Advantages are checked once more (all ranks' values): finite rewards can still overflow (e.g. 1e38 in float32).
- A reward function's output is read as TRL reads it (iterate, None -> NaN, one float32 per completion); what TRL
  cannot read (a single float, strings, an (N, 1) array or nested list, the wrong length) is an error naming the
  reward function and what it returned, raised on the rank that called it, before TRL's conversion fails without a
  name. The callables are wrapped (`checked_reward_funcs`) only while TRL scores; reward models are left alone.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from trl.trainer.utils import is_async_callable

from grpo_hub.config import features
from grpo_hub.config.hub_config import GRPOHubConfig
from grpo_hub.errors import field_error

SHOWN_ROWS = 10  # at most this many row indices in a message


def _rows_text(rows) -> str:
    rows = [int(r) for r in rows]
    more = f" (and {len(rows) - SHOWN_ROWS} more)" if len(rows) > SHOWN_ROWS else ""
    return ", ".join(map(str, rows[:SHOWN_ROWS])) + more


def empty_prompt_rows(dataset) -> list[int]:
    """Rows of a `datasets.Dataset` whose "prompt" is empty ("" or no messages) or null; [] for other data and for a
    dataset without a "prompt" column (environment-owned prompts; without an environment the batch check refuses)."""
    from datasets import Dataset

    if not isinstance(dataset, Dataset) or "prompt" not in dataset.column_names:
        return []
    import pyarrow as pa
    import pyarrow.compute as pc

    column = dataset.with_format("arrow")["prompt"]
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        length = pc.utf8_length(column)
    elif pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        length = pc.list_value_length(column)
    else:
        return []
    empty = pc.or_kleene(pc.is_null(column), pc.equal(length, 0)).fill_null(True)
    return np.flatnonzero(empty.to_numpy(zero_copy_only=False)).tolist()


def check_dataset_prompts(datasets: dict) -> None:
    """Raise naming the dataset (`train_dataset`, `eval_dataset[name]`) and the rows of empty prompts."""
    for name, dataset in datasets.items():
        rows = empty_prompt_rows(dataset)
        if rows:
            raise ValueError(
                f"`{name}`: empty prompt at row(s) {_rows_text(rows)}; an empty prompt has no token to generate "
                "from. Fix: drop or fill those rows (e.g. dataset.filter(lambda row: len(row['prompt']) > 0))."
            )


def checked_args(model, args) -> GRPOHubConfig:
    """The trainer's `args`: when None, TRL's default config named after `model` (a GRPOHubConfig); anything but a
    GRPOHubConfig raises."""
    if args is None:
        name = model if isinstance(model, str) else model.config._name_or_path
        args = GRPOHubConfig(f"{name.split('/')[-1]}-GRPO")
    if not isinstance(args, GRPOHubConfig):
        raise ValueError(f"`args` must be a GRPOHubConfig, got {type(args).__name__}; build a GRPOHubConfig.")
    return args


def named_datasets(train_dataset, eval_dataset) -> dict:
    """The trainer's datasets by the names `check_dataset_prompts` gives them: `train_dataset`, `eval_dataset` or, for
    a dict of eval datasets, `eval_dataset[name]` each."""
    eval_sets = eval_dataset if isinstance(eval_dataset, dict) else {"": eval_dataset}
    return {"train_dataset": train_dataset} | {
        f"eval_dataset[{k!r}]" if k else "eval_dataset": v for k, v in eval_sets.items()
    }


def check_batch_prompts(inputs: list[dict], environment_prompts: bool = False) -> None:
    """Raise before generation when a prompt of the batch is empty (data without a row index, e.g. iterable).

    `environment_prompts` (TRL's `environment_factory`): a row may leave out "prompt", the environment's reset()
    supplies it (TRL 1.16 `_generate_and_score_completions`); a "prompt" that is there and empty still crashes.
    """
    rows = [
        i
        for i, row in enumerate(inputs)
        if not (environment_prompts and "prompt" not in row)
        and (row.get("prompt") is None or len(row["prompt"]) == 0)
    ]
    if rows:
        raise ValueError(
            f"`train_dataset`: empty prompt at position(s) {_rows_text(rows)} of a batch; an empty prompt has no "
            "token to generate from. Fix: filter empty prompts out of the dataset."
        )


def check_rewards_finite(rewards_per_func: torch.Tensor, names: list[str]) -> None:
    """Raise when a reward function returned +-inf ((rows, functions) over all ranks; NaN = not scored)."""
    infinite = torch.isinf(rewards_per_func)
    if not infinite.any():
        return
    problems = [
        f"{names[i]!r} at row(s) {_rows_text(torch.nonzero(infinite[:, i]).flatten().tolist())}"
        for i in range(rewards_per_func.shape[1])
        if infinite[:, i].any()
    ]
    raise ValueError(
        f"`reward_funcs`: infinite reward from {'; '.join(problems)} (rows of the generation batch, all ranks). "
        "An infinite reward makes the advantages and then the weights NaN. Fix: return a finite number, or "
        "None/NaN for a completion the function does not score."
    )


def check_advantages_finite(advantages: torch.Tensor) -> None:
    """Raise when an advantage of the whole generation batch (all ranks, flattened) is not finite."""
    bad = int((~torch.isfinite(advantages)).sum())
    if bad:
        raise ValueError(
            f"`reward_funcs`: {bad} of {advantages.numel()} advantages of the generation batch are not finite (the "
            "rewards overflow float32 arithmetic). Fix: scale the rewards down, or set reward_clip / reward_norm."
        )


def check_trainer_options(
    args, *, multi_turn: bool, is_vlm: bool, has_reference: bool, datasets: dict
) -> None:
    """Options that depend on what the trainer was given (rollouts, model kind, reference), and the prompts of
    `datasets` ({name: dataset}); raises ValueError naming the field and the fix."""
    if features.is_on("turn_ratios", args) and not multi_turn:
        raise ValueError(
            "`importance_sampling_level`: 'turn' needs multi-turn rollouts. Fix: pass `tools`, "
            "`environment_factory` or `rollout_func` to the trainer, or use 'token'/'sequence'."
        )
    if is_vlm and (args.filter_zero_signal or args.uses_own_loss):
        raise ValueError(
            "`filter_zero_signal`: dropping rows, loss_agg_mode and turn-level ratios are not supported for "
            "vision-language models. Fix: set filter_zero_signal=False and loss_agg_mode=None."
        )
    if features.is_on("async_rollouts", args) and (multi_turn or is_vlm):
        field_error(
            "max_staleness",
            "asynchronous rollouts send a batch's text prompts to the server in one request, but tools, environments "
            "and rollout_func generate turn by turn, and images need TRL's own server path.",
            "set max_staleness=0, or train without tools / environment_factory / rollout_func / images.",
        )
    if features.is_on("hints", args) and (multi_turn or is_vlm):
        field_error("hint_column", "a hint is the start of one text answer, but tools, environments and rollout_func "
                    "generate turn by turn, and images need TRL's own prompt path.",
                    "set hint_column=None, or train without tools / environment_factory / rollout_func / images.")  # fmt: skip
    check_dataset_prompts(datasets)
    for feature in features.tagged(features.NEEDS_REFERENCE):
        if feature.is_on(args) and not has_reference:
            raise ValueError(
                f"`{feature.field}`: needs reference log-probs, which TRL only has with beta != 0 or a PEFT "
                "model. Fix: set beta > 0 or train a LoRA adapter (peft_config=...)."
            )


def _describe(output) -> str:
    """Type and shape (array, tensor), length and element types (list, tuple), or a short repr of `output`."""
    kind = type(output).__name__
    if isinstance(output, (np.ndarray, torch.Tensor)):
        return f"{kind} of shape {tuple(output.shape)}"
    if isinstance(output, (list, tuple)):
        elements = ", ".join(sorted({type(v).__name__ for v in output}))
        return f"{kind} of {len(output)} values ({elements or 'empty'})"
    text = repr(output)
    return f"{kind} {text[:40] + '...' if len(text) > 40 else text}"


def check_reward_output(output, name: str, num_completions: int) -> list:
    """`output` as a list, when TRL can read it as one float32 per completion; else raise naming `name`.

    TRL 1.16 (`GRPOTrainer._calculate_rewards`) iterates the output, maps None to NaN, checks the length and
    converts with `torch.tensor(..., dtype=float32)` into a column of `num_completions` rewards: a list of
    numbers/None, a 1-D array or tensor, a generator all pass. The list returned here is read by TRL as before.
    """

    def refuse(problem: str):
        raise ValueError(
            f"`reward_funcs`: reward function {name!r} returned {_describe(output)} for {num_completions} "
            f"completions; {problem} Fix: return one float, or None, per completion (a list of {num_completions} "
            "values, or a 1-D numpy array or tensor)."
        )

    if isinstance(output, str):  # TRL reads its characters, and fails on them
        refuse("text is not a reward.")
    try:
        values = list(output)
    except TypeError:
        refuse("it is not a sequence of rewards.")
    if len(values) != num_completions:
        refuse(f"{len(values)} rewards do not match the completions.")
    try:
        read = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError, OverflowError) as error:
        refuse(f"the values are not numbers ({error}).")
    if read.shape != (num_completions,):
        refuse(f"the values are not single numbers (they read as shape {tuple(read.shape)}).")
    return values


def checked_reward_funcs(reward_funcs: list, names: list[str]) -> list:
    """`reward_funcs` with each callable wrapped so its output passes `check_reward_output` on its way to TRL.

    TRL calls reward functions with keyword arguments (`prompts=...`); an async one stays async (TRL gathers the
    coroutines). Reward models (`nn.Module`) are returned unchanged: TRL reads their logits itself.
    """
    return [
        func if isinstance(func, torch.nn.Module) else _checked(func, name)
        for func, name in zip(reward_funcs, names, strict=True)
    ]


def _checked(func, name: str):
    if is_async_callable(func):

        async def checked(*args, **kwargs):
            return check_reward_output(await func(*args, **kwargs), name, len(kwargs["prompts"]))

    else:

        def checked(*args, **kwargs):
            return check_reward_output(func(*args, **kwargs), name, len(kwargs["prompts"]))

    checked.__name__ = checked.__qualname__ = name
    checked.__wrapped__ = func
    return checked
