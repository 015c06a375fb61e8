"""GRPOHubConfig builds in two phases, both here. `resolve` first turns presets and implied switches into plain
settings (in the numbered order of its docstring). `validate` then checks the resolved config: every feature row's
own checks (grpo_hub.config.features), then every conflict (grpo_hub.config.conflicts). Validation never
changes the config, so its outcome does not depend on the order of the checks (tested by running them in reverse).
"""

from __future__ import annotations

import warnings

from grpo_hub.algos import loss_types
from grpo_hub.algos.shared_prompts import exchange_block
from grpo_hub.config import conflicts, features, vllm_checks
from grpo_hub.config.validation import conflict_error
from grpo_hub.errors import field_error

TRL_EPSILON = 0.2


def resolve(c) -> None:
    """Turn presets and implied switches into plain settings, in this order (each step refuses an explicit value
    that contradicts it, before changing anything):

    1. A preset loss_type ('gspo', `loss_types.REGISTRY`) -> its TRL loss type ('grpo') with
       importance_sampling_level='sequence' and its clip range unless epsilon or epsilon_high is given;
       epsilon None -> TRL's 0.2; importance_sampling_level None -> 'token'; epsilon_high unset -> the loss
       type's default ('cispo': the recommended absolute cap 5.0).
    2. dual_clip_c -> TRL's delta (equal to dual-clip when dual_clip_c > 1 + epsilon_high).
    3. adv_norm='mean_only' -> scale_rewards='none'; the deprecated adv_norm='none' -> 'no_baseline'.
    4. vllm_is_preset -> TRL's vLLM IS mode and bounds (`vllm_checks.VLLM_IS_PRESETS`); the bounds are checked
       here, before TRL's own checks read them.
    5. dynamic_sampling -> filter_zero_signal=True (recorded in `implied_by`, so errors name the switch the user set).
    6. zero_signal_pack None -> on when filtering is on and packing is exact (`conflicts.moves_rows_exactly`), else off.
    7. vllm_adapter_sync in server mode -> vllm_server_sync='adapter' when it is 'auto'.
    8. After TRL's own resolution: `resolve_after_trl`.
    """
    loss = loss_types.REGISTRY.get(c.loss_type)  # an unknown loss_type is refused by validation
    if loss is not None and loss.is_preset:
        if loss.sequence_level and c.importance_sampling_level not in (None, "sequence"):
            field_error(
                "importance_sampling_level",
                f"loss_type={loss.name!r} is sequence-level but importance_sampling_level="
                f"{c.importance_sampling_level!r}.",
                f"leave importance_sampling_level unset, or use loss_type={loss.trl_loss_type!r} for a token/turn-"
                "level ratio.",
            )
        c.loss_type = loss.trl_loss_type
        c.importance_sampling_level = "sequence" if loss.sequence_level else c.importance_sampling_level
        if loss.clip_range is not None and c.epsilon is None and c.epsilon_high is None:
            c.epsilon, c.epsilon_high = loss.clip_range
    c.epsilon = TRL_EPSILON if c.epsilon is None else c.epsilon
    c.importance_sampling_level = c.importance_sampling_level or "token"
    if loss is not None and loss.default_epsilon_high is not None and c.epsilon_high is None:
        c.epsilon_high = loss.default_epsilon_high
    if features.is_on("dual_clip", c):
        if c.delta is not None and c.delta != c.dual_clip_c:
            conflict_error(
                "dual_clip_c",
                "delta",
                "set the same cap differently.",
                "set only one of dual_clip_c and delta.",
            )
        c.delta = c.dual_clip_c
    if c.adv_norm == "none":  # the old name, easily confused with adv_norm=None (TRL decides)
        warnings.warn(
            "adv_norm='none' is deprecated: use adv_norm='no_baseline'.", FutureWarning, stacklevel=4
        )
        c.adv_norm = "no_baseline"
    if c.adv_norm == "mean_only":
        if c.scale_rewards == "batch":
            conflict_error(
                "adv_norm", "scale_rewards", "'mean_only' contradicts 'batch'.", "unset one of them."
            )
        c.scale_rewards = "none"
    apply_vllm_is_preset(c)
    vllm_checks.check_is_bounds(c)
    if c.dynamic_sampling and not c.filter_zero_signal:
        c.filter_zero_signal = True
        c.implied_by["filter_zero_signal"] = "dynamic_sampling"
    if c.filter_zero_signal and c.zero_signal_pack is None:
        c.zero_signal_pack = conflicts.moves_rows_exactly(c)
    if (
        features.is_on("vllm_adapter_sync", c)
        and features.is_on("vllm_server_sync", c)
        and c.vllm_server_sync == "auto"
    ):
        c.vllm_server_sync = "adapter"


def resolve_after_trl(c) -> None:
    """8. shared_prompts_whole_groups None -> on when shared prompts are on, two or more buffered micro-batches always
    share an optimizer step (`shared_prompts.exchange_block`, of the steps_per_generation TRL resolves in its own
    __post_init__, hence after it) and moving rows between them is exact (`conflicts.moves_rows_exactly`), else off."""
    if features.is_on("shared_prompts", c) and c.shared_prompts_whole_groups is None:
        block = exchange_block(c.steps_per_generation, c.gradient_accumulation_steps)
        c.shared_prompts_whole_groups = block > 1 and conflicts.moves_rows_exactly(c)


def apply_vllm_is_preset(config) -> None:
    """`vllm_is_preset` -> TRL's IS mode and bounds, refusing an explicit value that contradicts it."""
    preset = config.vllm_is_preset
    if preset is None:
        return
    if preset not in vllm_checks.VLLM_IS_PRESETS:
        field_error(
            "vllm_is_preset",
            f"{preset!r} is not a preset.",
            f"use one of {tuple(vllm_checks.VLLM_IS_PRESETS)}.",
        )
    values = vllm_checks.VLLM_IS_PRESETS[preset]
    if config.vllm_importance_sampling_mode not in (vllm_checks.TRL_DEFAULT_IS_MODE, values["mode"]):
        field_error(
            "vllm_importance_sampling_mode",
            f"{config.vllm_importance_sampling_mode!r} contradicts vllm_is_preset={preset!r} ({values['mode']}).",
            "unset one of them.",
        )
    if config.vllm_importance_sampling_clip_max not in (vllm_checks.TRL_DEFAULT_CLIP_MAX, values["clip_max"]):
        field_error(
            "vllm_importance_sampling_clip_max",
            f"{config.vllm_importance_sampling_clip_max} contradicts vllm_is_preset={preset!r} "
            f"(cap {values['clip_max']}).",
            "unset one of them.",
        )
    if config.vllm_importance_sampling_clip_min is not None:
        field_error(
            "vllm_importance_sampling_clip_min",
            f"vllm_is_preset={preset!r} has no lower bound.",
            "unset vllm_importance_sampling_clip_min or the preset.",
        )
    config.vllm_importance_sampling_mode = values["mode"]
    config.vllm_importance_sampling_clip_max = values["clip_max"]


def validate(c, checks=None, rules=conflicts.CONFLICTS) -> None:
    """Phase 2: every feature's own checks on the resolved config, then every conflict (nothing is changed).

    `checks`/`rules` default to the tables'; a test passes them reordered to show the order does not matter.
    """
    for check in checks or [check for f in features.FEATURES for check in f.checks]:
        check(c)
    for rule in rules:
        if rule.applies(c):
            conflict_error(rule.first, rule.second, rule.problem, rule.fix, implied_by=c.implied_by)
