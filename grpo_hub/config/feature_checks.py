"""Each feature's own value checks, on the resolved config (phase 2 of GRPOHubConfig; each row of
grpo_hub.config.features names its own). A check reads its feature's fields and raises; it never changes anything.
Rules that involve two features are conflicts (grpo_hub.config.conflicts).
"""

from __future__ import annotations

from grpo_hub.algos import (
    advantages,
    importance,
    loss_types,
    losses,
    padding_free,
    selection,
    shared_prompts,
)
from grpo_hub.config.lr_schedule import schedule_multiplier
from grpo_hub.config.validation import check_choice, check_positive
from grpo_hub.config.vllm_checks import check_sampler_matches_trainer
from grpo_hub.errors import field_error
from grpo_hub.generation import server

ZERO_SIGNAL_NORMALIZERS = ("kept", "all")
DYNAMIC_SAMPLING_ON_CAP = ("train", "error")
SELECTIVE_ROLLOUT_MODES = ("replace", "shrink")
ROLLOUT_BUDGETS = ("uniform", "knapsack", "signal")


def check_loss_type(c) -> None:
    check_choice("loss_type", c.loss_type, loss_types.NAMES)


def check_ratio_level(c) -> None:
    check_choice("importance_sampling_level", c.importance_sampling_level, losses.LEVELS)


def check_clip(c) -> None:
    if c.epsilon < 0:
        field_error("epsilon", f"must be >= 0, got {c.epsilon}.", "use a small positive value such as 0.2.")
    if c.epsilon_high is not None and c.epsilon_high < 0:
        field_error(
            "epsilon_high", f"must be >= 0, got {c.epsilon_high}.", "use e.g. 0.28 (or 5.0 for cispo)."
        )
    loss = loss_types.REGISTRY.get(c.loss_type)  # (an unknown loss_type: check_loss_type)
    absolute_cap = loss is not None and loss.surrogate.absolute_cap  # epsilon_high caps the ratio itself
    if not absolute_cap and c.epsilon >= 1:
        field_error(
            "epsilon",
            f"the lower clip bound 1 - epsilon = {1 - c.epsilon} is not positive, so the clip range is inverted.",
            "use epsilon < 1.",
        )
    if absolute_cap and c.epsilon_high <= 1:
        field_error(
            "epsilon_high",
            f"with loss_type='cispo' it is the absolute ratio cap, and {c.epsilon_high} <= 1 down-weights every "
            "on-policy token.",
            "use epsilon_high > 1 (recommended 5.0) or leave it unset.",
        )


def check_dual_clip(c) -> None:
    loss = loss_types.REGISTRY.get(c.loss_type)
    if (
        c.dual_clip_c is None or loss is None or not loss.surrogate.dual_clip
    ):  # other surrogates: conflicts.py
        return
    upper = 1 + (c.epsilon_high if c.epsilon_high is not None else c.epsilon)
    if c.dual_clip_c <= upper:
        field_error(
            "dual_clip_c",
            f"must be > 1 + epsilon_high = {upper}, got {c.dual_clip_c}.",
            "use e.g. dual_clip_c=3.0.",
        )


def check_loss_agg(c) -> None:
    check_choice("loss_agg_mode", c.loss_agg_mode, losses.AGG_MODES, optional=True)


def check_filtering(c) -> None:
    if c.zero_signal_eps < 0:
        field_error(
            "zero_signal_eps", f"must be >= 0, got {c.zero_signal_eps}.", "use 0.0 or a small spread."
        )
    check_choice("zero_signal_normalizer", c.zero_signal_normalizer, ZERO_SIGNAL_NORMALIZERS)


def check_dynamic_sampling(c) -> None:
    check_choice("dynamic_sampling_on_cap", c.dynamic_sampling_on_cap, DYNAMIC_SAMPLING_ON_CAP)
    if c.dynamic_sampling_max_rounds < 0:
        field_error(
            "dynamic_sampling_max_rounds",
            f"must be >= 0, got {c.dynamic_sampling_max_rounds}.",
            "use e.g. 4.",
        )
    target = c.dynamic_sampling_target_groups
    groups_per_batch = c.generation_batch_size // c.num_generations
    reachable = (1 + c.dynamic_sampling_max_rounds) * groups_per_batch
    if c.dynamic_sampling and target is not None and not 1 <= target <= reachable:
        field_error(
            "dynamic_sampling_target_groups",
            f"must be in [1, {reachable}] ((1 + dynamic_sampling_max_rounds) x {groups_per_batch} groups per "
            f"generation batch), got {target}.",
            "lower the target or raise dynamic_sampling_max_rounds.",
        )


def check_rollout_budget(c) -> None:
    check_choice("rollout_budget", c.rollout_budget, ROLLOUT_BUDGETS)
    low, high, group = c.rollout_budget_min, c.rollout_budget_max, c.num_generations
    if isinstance(low, bool) or not isinstance(low, int) or low < 2:
        field_error("rollout_budget_min", f"must be an integer >= 2, got {low!r}; a group of one has no baseline.",
                    "use 2.")  # fmt: skip
    if low > group:
        field_error("rollout_budget_min", f"is {low}, above num_generations={group}: the batch's completions (prompts x "
                    "num_generations) cannot give every prompt that many.", f"use at most {group}.")  # fmt: skip
    if high is not None and (isinstance(high, bool) or not isinstance(high, int) or high < group):
        field_error("rollout_budget_max", f"must be an integer >= num_generations={group} or None, got {high!r}.",
                    "use None (4 x num_generations).")  # fmt: skip


def check_hints(c) -> None:
    if c.hint_column == "":
        field_error(
            "hint_column", f"must name a dataset column, got {c.hint_column!r}.", "use a column name or None."
        )
    if not isinstance(c.hint_separator, str) or not c.hint_separator:
        field_error("hint_separator", f"must be a non-empty string, got {c.hint_separator!r}.",
                    "use the text between a solution's steps, e.g. '\\n'.")  # fmt: skip
    if isinstance(c.hint_window, bool) or not isinstance(c.hint_window, int) or c.hint_window < 1:
        field_error("hint_window", f"must be an integer >= 1, got {c.hint_window!r}.",
                    "use a few groups' completions, e.g. 4 x num_generations.")  # fmt: skip
    for name in ("hint_shorten_at", "hint_end"):
        value = getattr(c, name)
        if value is not None and not 0 < value <= 1:
            field_error(name, f"must lie in (0, 1], got {value!r}.", "use a share such as 0.5 or 1.0.")


def check_selective_rollout(c) -> None:
    check_choice("selective_rollout_mode", c.selective_rollout_mode, SELECTIVE_ROLLOUT_MODES)
    ranges = {
        "selective_rollout_target_zero_frac": (0.0, 1.0),
        "selective_rollout_explore_init": (selection.EXPLORE_LOW, selection.EXPLORE_HIGH),
        "selective_rollout_explore_step": (0.0, 1.0),
    }
    for name, (low, high) in ranges.items():
        if not low <= getattr(c, name) <= high:
            field_error(name, f"must be in [{low}, {high}], got {getattr(c, name)}.", "use its default.")
    if not 0.0 < c.selective_rollout_min_keep_prob <= 1.0:
        field_error(
            "selective_rollout_min_keep_prob",
            f"must be in (0, 1], got {c.selective_rollout_min_keep_prob}; 0 would never revisit a prompt.",
            "use e.g. 0.01.",
        )
    revisit = c.selective_rollout_revisit_after
    if revisit is not None and (isinstance(revisit, bool) or not isinstance(revisit, int) or revisit < 1):
        field_error(
            "selective_rollout_revisit_after",
            f"must be an integer >= 1 or None, got {revisit!r}.",
            "use 1 (a prompt waits at most as many visits as its zero-signal streak), or None for no bound.",
        )
    low, high = c.selective_rollout_reward_min, c.selective_rollout_reward_max
    if low is not None and high is not None and not low < high:
        field_error(
            "selective_rollout_reward_min",
            f"must be < selective_rollout_reward_max, got {low} >= {high}.",
            "give the reward function's lowest and highest value.",
        )


def check_turn_advantages(c) -> None:
    check_choice("turn_advantages", c.turn_advantages, advantages.TURN_SCOPES, optional=True)


def check_reward_clip(c) -> None:
    check_positive("reward_clip", c.reward_clip)


def check_reward_norm(c) -> None:
    check_choice("reward_norm", c.reward_norm, advantages.REWARD_NORMS, optional=True)
    if c.reward_shift and c.reward_scale:
        field_error("reward_shift", "and reward_scale together leave nothing to normalise.", "set only one.")


def check_kl_in_reward(c) -> None:
    if c.token_level_kl_coef < 0:
        field_error(
            "token_level_kl_coef", f"must be >= 0, got {c.token_level_kl_coef}.", "use 0.0 or e.g. 0.001."
        )


def check_adv_norm(c) -> None:
    check_choice("adv_norm", c.adv_norm, advantages.NORMS, optional=True)


def check_adv_clip(c) -> None:
    check_positive("adv_clip_range", c.adv_clip_range)


def check_vllm_is(c) -> None:
    check_sampler_matches_trainer(c)
    check_choice("vllm_is_pooling", c.vllm_is_pooling, importance.POOLINGS, optional=True)


def check_vllm_server_sync(c) -> None:
    check_choice("vllm_server_sync", c.vllm_server_sync, server.SYNC_MODES)


def check_max_staleness(c) -> None:
    if c.max_staleness < 0:
        field_error(
            "max_staleness",
            f"is a number of optimizer steps, got {c.max_staleness}.",
            "use 0 (synchronous) or a positive bound such as 1.",
        )


REF_SYNC_MODES = ("never", "steps", "epoch")  # when the frozen 'ref' adapter is refreshed


def validate_reference_settings(
    sync_on: str, sync_steps: int, mixup_alpha: float, beta: float, sync_ref_model: bool, keep: bool
) -> None:
    """Raise ValueError, naming the field and the fix, for reference-adapter settings that cannot work."""
    check_choice("ref_adapter_sync_on", sync_on, REF_SYNC_MODES)
    if isinstance(sync_steps, bool) or not isinstance(sync_steps, int) or sync_steps < 1:
        field_error("ref_adapter_sync_steps", f"must be an int >= 1, got {sync_steps!r}.", "use e.g. 64.")
    if not 0.0 < mixup_alpha <= 1.0:
        field_error(
            "ref_adapter_mixup_alpha",
            f"must be in (0, 1] (1.0 = hard copy, < 1 = EMA), got {mixup_alpha!r}.",
            "use 1.0 or e.g. 0.5.",
        )
    setting = "ref_adapter_sync_on" if sync_on != "never" else "ref_adapter_keep"
    if (sync_on != "never" or keep) and beta == 0.0:
        field_error(
            setting,
            "needs a KL term, but `beta` is 0, so TRL computes no reference log-probs and a reference adapter "
            "has no effect.",
            "set `beta` > 0, or `ref_adapter_sync_on='never'` and `ref_adapter_keep=False`.",
        )
    if sync_on != "never" and sync_ref_model:
        field_error(
            "ref_adapter_sync_on",
            "and `sync_ref_model=True` (TRL's refresh of a full reference model, which raises "
            "NotImplementedError with PEFT) both refresh the reference.",
            "set only one of them: ref_adapter_sync_on for a PEFT reference adapter.",
        )


def check_reference_adapter(c) -> None:
    validate_reference_settings(
        c.ref_adapter_sync_on,
        c.ref_adapter_sync_steps,
        c.ref_adapter_mixup_alpha,
        c.beta,
        c.sync_ref_model,
        c.ref_adapter_keep,
    )


def check_whole_groups(c) -> None:
    """shared_prompts_whole_groups=True moves rows only inside blocks of micro-batches that always share an
    optimizer step (`shared_prompts.exchange_block`): with blocks of one micro-batch it would change nothing."""
    block = shared_prompts.exchange_block(c.steps_per_generation, c.gradient_accumulation_steps)
    if c.shared_prompts_whole_groups and block == 1:
        field_error(
            "shared_prompts_whole_groups",
            f"has no effect: no two micro-batches of a generation batch are sure to train in one optimizer step "
            f"(gcd(steps_per_generation={c.steps_per_generation}, gradient_accumulation_steps="
            f"{c.gradient_accumulation_steps}) = 1), so no row can move to its group's micro-batch.",
            "leave shared_prompts_whole_groups unset, or use a gradient_accumulation_steps that shares a factor with "
            "steps_per_generation (unset, steps_per_generation is gradient_accumulation_steps).",
        )


def check_padding_free(c) -> None:
    """An attention implementation asked for in `model_init_kwargs` must read packed rows (the model itself is checked
    when the trainer is built: grpo_hub.training.padding_free.check_model)."""
    kwargs = c.model_init_kwargs if isinstance(c.model_init_kwargs, dict) else {}
    attention = kwargs.get("attn_implementation")
    if c.padding_free and attention is not None and attention not in padding_free.ATTENTION:
        field_error(
            "padding_free",
            f"packs rows for {' or '.join(padding_free.ATTENTION)} attention, but `model_init_kwargs` asks for "
            f"attn_implementation={attention!r}.",
            f"set padding_free=False, or attn_implementation to one of {padding_free.ATTENTION}.",
        )


def check_time_budget(c) -> None:
    """A positive budget, a pace measured over at least one step after the first, and a schedule by step (one
    transformers can rebuild for another length: `lr_schedule.schedule_multiplier` raises)."""
    if c.time_budget_seconds is None:
        return
    check_positive("time_budget_seconds", c.time_budget_seconds)
    if c.time_budget_calibration_steps < 2:
        field_error(
            "time_budget_calibration_steps",
            f"must be >= 2 (the pace is measured over the steps after the first), got "
            f"{c.time_budget_calibration_steps}.",
            "use e.g. 4.",
        )
    schedule_multiplier(c, 100, c.learning_rate)
