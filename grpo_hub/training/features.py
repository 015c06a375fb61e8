"""Every grpo_hub feature, described once: its switch, the fields that need it, its checks (in feature_checks.py),
its conflicts.

GRPOHubConfig builds in two phases. `resolve` first turns presets and implied switches into plain settings (in
the numbered order of its docstring). `validate` then checks the resolved config: it never changes it, so its
outcome does not depend on the order of the checks (tested by running them in reverse). What a feature needs,
what it conflicts with and what it changes is read from here: `effect_needs()` (fields with no effect while their
switch is off), `CONFLICTS` (pairs refused with both fields named), and docs/compatibility.md, generated from
`FEATURES` by building every pair of their `example` settings (tests/training/test_compatibility.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from grpo_hub.algos import loss_types
from grpo_hub.training import feature_checks
from grpo_hub.training.validation import conflict_error, field_error
from grpo_hub.training.vllm_checks import resolve_vllm_is

TRL_EPSILON = 0.2
# The switches that act on zero-signal groups; filter_zero_signal last, as dynamic_sampling implies it, so a refused
# combination names the switch the user set.
SIGNAL_SWITCHES = ("dynamic_sampling", "selective_rollout", "filter_zero_signal")


# --- predicates on a (resolved) config, named once ---
def entropy_bonus(c) -> bool:
    return c.entropy_coef != 0.0 or c.use_adaptive_entropy


def normalizer(c) -> str:
    return loss_types.loss_normalizer(c.loss_type, c.loss_agg_mode)


def uses_own_loss(c) -> bool:
    return c.loss_agg_mode is not None or c.importance_sampling_level == "turn"


# The edits GRPOHubTrainer makes to TRL's advantages: field -> whether the config sets it.
ADVANTAGE_EDITS = {
    "adv_norm": lambda c: c.adv_norm == "no_baseline",
    "whiten_advantages": lambda c: c.whiten_advantages,
    "adv_clip_range": lambda c: c.adv_clip_range is not None,
    "token_level_kl_coef": lambda c: c.token_level_kl_coef > 0,
}


def recomputes_advantages(c) -> bool:
    return any(is_set(c) for is_set in ADVANTAGE_EDITS.values())


def pack_blockers(c) -> list[tuple[str, str]]:
    """(field, why) for each setting under which moving rows between micro-steps changes the gradient."""
    reasons = []
    if normalizer(c) == loss_types.MICRO_TOKENS:
        reasons.append(("loss_type", f"loss_type={c.loss_type!r} is a token mean over each micro-batch"))
    if c.top_entropy_quantile < 1.0:
        reasons.append(("top_entropy_quantile", "the entropy quantile is taken over each micro-batch"))
    if entropy_bonus(c):
        reasons.append(("entropy_coef", "TRL's entropy bonus is a token mean over each micro-batch"))
    return reasons


def check_packing(c) -> None:
    if c.zero_signal_pack:
        for name, reason in pack_blockers(c):
            conflict_error(
                "zero_signal_pack", name, f"cannot apply: {reason}.", "leave zero_signal_pack unset."
            )


# --- phase 1: resolve ---
def resolve(c) -> None:
    """Turn presets and implied switches into plain settings, in this order (each step refuses an explicit value
    that contradicts it, before changing anything):

    1. A preset loss_type ('gspo', `loss_types.REGISTRY`) -> its TRL loss type ('grpo') with
       importance_sampling_level='sequence' and its clip range unless epsilon or epsilon_high is given;
       epsilon None -> TRL's 0.2; importance_sampling_level None -> 'token'; epsilon_high unset -> the loss
       type's default ('cispo': the recommended absolute cap 5.0).
    2. dual_clip_c -> TRL's delta (equal to dual-clip when dual_clip_c > 1 + epsilon_high).
    3. adv_norm='mean_only' -> scale_rewards='none'; the deprecated adv_norm='none' -> 'no_baseline'.
    4. vllm_is_preset -> TRL's vLLM IS mode and bounds (`vllm_checks.resolve_vllm_is`).
    5. dynamic_sampling -> filter_zero_signal=True (recorded in `implied_by`, so errors name the switch the user set).
    6. zero_signal_pack None -> on when filtering is on and packing is exact (`pack_blockers`), else off.
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
    if c.dual_clip_c is not None:
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
    resolve_vllm_is(c)
    if c.dynamic_sampling and not c.filter_zero_signal:
        c.filter_zero_signal = True
        c.implied_by["filter_zero_signal"] = "dynamic_sampling"
    if c.filter_zero_signal and c.zero_signal_pack is None and c.loss_type in loss_types.REGISTRY:
        c.zero_signal_pack = not pack_blockers(c)  # (an unknown loss_type is refused by validation)


# --- the features ---
@dataclass(frozen=True)
class Dependents:
    """Fields that have an effect only when `holds(config)`; `needs` says what that takes, in words."""

    fields: tuple[str, ...]
    needs: str
    holds: Callable


@dataclass(frozen=True)
class Feature:
    name: str
    example: (
        dict | None
    )  # a setting that switches it on (compatibility matrix, pairwise test); None: always on
    checks: tuple[Callable, ...] = ()  # the feature's own value checks on the resolved config
    dependents: tuple[Dependents, ...] = ()
    page: str = ""  # docs page
    needs_peft: bool = False  # the example trains only a PEFT model
    multi_turn: bool = False  # the example trains only on tool-calling rollouts (per-turn rewards)
    trains: bool = (
        True  # False: refused, or needs what the CPU test machine lacks (vLLM), so config-time only
    )


FEATURES = (
    Feature(
        "policy_loss", None, (feature_checks.check_loss_type, feature_checks.check_clip), page="variants.md"
    ),
    Feature("gspo", {"loss_type": "gspo"}, page="variants.md"),
    Feature("cispo", {"loss_type": "cispo"}, page="variants.md"),
    Feature("dual_clip", {"dual_clip_c": 3.0}, (feature_checks.check_dual_clip,), page="variants.md"),
    Feature(
        "loss_agg_mode",
        {"loss_agg_mode": "seq-mean-token-sum"},
        (feature_checks.check_loss_agg,),
        page="variants.md",
    ),
    Feature(
        "filtering",
        {"filter_zero_signal": True},
        (feature_checks.check_filtering,),
        (
            Dependents(
                ("zero_signal_eps",),
                "filter_zero_signal=True, dynamic_sampling=True or selective_rollout=True",
                lambda c: any(getattr(c, s) for s in SIGNAL_SWITCHES),
            ),
            Dependents(
                ("zero_signal_normalizer", "zero_signal_pack"),
                "filter_zero_signal=True or dynamic_sampling=True",
                lambda c: c.filter_zero_signal or c.dynamic_sampling,
            ),
        ),
        page="filtering.md",
    ),
    Feature(
        "packing",
        {"filter_zero_signal": True, "zero_signal_pack": True},
        (check_packing,),
        page="filtering.md",
    ),
    Feature(
        "dynamic_sampling",
        {"dynamic_sampling": True},
        (feature_checks.check_dynamic_sampling,),
        (
            Dependents(
                ("dynamic_sampling_target_groups", "dynamic_sampling_max_rounds", "dynamic_sampling_on_cap"),
                "dynamic_sampling=True",
                lambda c: c.dynamic_sampling,
            ),
        ),
        page="dynamic-sampling.md",
    ),
    Feature(
        "selective_rollout",
        {"selective_rollout": True},
        (feature_checks.check_selective_rollout,),
        (
            Dependents(
                tuple(
                    f"selective_rollout_{name}"
                    for name in (
                        "id_column",
                        "target_zero_frac",
                        "explore_init",
                        "explore_step",
                        "min_keep_prob",
                        "revisit_after",
                        "reward_min",
                        "reward_max",
                    )
                ),
                "selective_rollout=True",
                lambda c: c.selective_rollout,
            ),
        ),
        page="selective-rollout.md",
    ),
    Feature(
        "ref_adapter_refresh",
        {"ref_adapter_sync_on": "steps", "ref_adapter_sync_steps": 1, "beta": 0.04},
        (feature_checks.check_reference_adapter,),
        (
            Dependents(
                ("ref_adapter_sync_steps",),
                "ref_adapter_sync_on='steps'",
                lambda c: c.ref_adapter_sync_on == "steps",
            ),
            Dependents(
                ("ref_adapter_mixup_alpha",),
                "ref_adapter_sync_on='steps' or 'epoch'",
                lambda c: c.ref_adapter_sync_on != "never",
            ),
            Dependents(
                ("ref_adapter_save",),
                "beta > 0 (without a KL term there is no 'ref' adapter)",
                lambda c: c.beta != 0.0,
            ),
        ),
        page="reference-adapter.md",
        needs_peft=True,
    ),
    Feature(
        "turn_advantages",
        {"turn_advantages": "turn"},
        (feature_checks.check_turn_advantages,),
        page="multi-turn.md",
        multi_turn=True,
    ),
    Feature(
        "reward_clip",
        {"reward_clip": 0.5},
        (feature_checks.check_rewards,),
        (
            Dependents(
                ("reward_shift", "reward_scale"),
                "reward_norm='batch' or 'running'",
                lambda c: c.reward_norm is not None,
            ),
        ),
        page="variants.md",
    ),
    Feature("reward_norm", {"reward_norm": "batch"}, page="variants.md"),
    Feature("kl_in_reward", {"token_level_kl_coef": 0.01, "beta": 0.04}, page="variants.md"),
    Feature("adv_norm", {"adv_norm": "no_baseline"}, (feature_checks.check_advantages,), page="variants.md"),
    Feature("whiten_advantages", {"whiten_advantages": True}, page="variants.md"),
    Feature("adv_clip", {"adv_clip_range": 1.0}, page="variants.md"),
    Feature("entropy_bonus", {"entropy_coef": 0.01}, page="variants.md"),
    Feature(
        "vllm_is",
        {"use_vllm": True, "vllm_importance_sampling_mode": "sequence_mask", "vllm_is_pooling": "mean"},
        (feature_checks.check_vllm_is,),
        (
            Dependents(
                ("vllm_is_pooling", "vllm_is_preset"),
                "use_vllm=True and vllm_importance_sampling_correction=True",
                lambda c: c.use_vllm and c.vllm_importance_sampling_correction,
            ),
        ),
        page="vllm.md",
        trains=False,
    ),
    Feature(
        "vllm_adapter_sync",
        {"use_vllm": True, "vllm_adapter_sync": True},
        dependents=(Dependents(("vllm_adapter_sync",), "use_vllm=True", lambda c: c.use_vllm),),
        page="vllm.md",
        needs_peft=True,
        trains=False,
    ),
)


SWITCHES = {f.name: f for f in FEATURES if f.example is not None}  # the features a user turns on


def pair_settings(first: str, second: str) -> dict | None:
    """Both switches' example settings together, or None when they set one field to two values (then the two are
    alternatives, not a pair: e.g. the gspo and cispo presets). The compatibility test and page build these."""
    a, b = SWITCHES[first].example, SWITCHES[second].example
    if any(key in b and b[key] != value for key, value in a.items()):
        return None
    return {**a, **b}


def effect_needs() -> dict[str, tuple[str, Callable]]:
    """field -> (what it needs, predicate): a field set away from its default with the predicate False is an error."""
    return {name: (d.needs, d.holds) for f in FEATURES for d in f.dependents for name in d.fields}


# --- conflicts between features: each names both fields ---
@dataclass(frozen=True)
class Conflict:
    """`first` and `second` together are refused when `applies(config)`; `problem` says why, `fix` what to do."""

    first: str
    second: str
    applies: Callable
    problem: str
    fix: str


def _signal_conflicts() -> list[Conflict]:
    """Filtering, dynamic sampling and selective rollout skip zero-spread groups, exact only where such a group's
    advantages are zero: not when advantages have no baseline, are whitened over the batch, include the KL in the
    reward or come per turn, nor when reward functions are normalised one by one (a flat weighted sum can hide
    varying functions). Zero-signal groups are found from the rewards after reward_clip / reward_norm, which are
    the advantages' input."""
    carriers = {
        "adv_norm": (lambda c: c.adv_norm == "no_baseline", "adv_norm='no_baseline' (A = r)"),
        "whiten_advantages": (lambda c: c.whiten_advantages, "whitening over the batch"),
        "token_level_kl_coef": (lambda c: c.token_level_kl_coef > 0, "the KL in the reward"),
        "turn_advantages": (lambda c: c.turn_advantages is not None, "per-turn rewards"),
        "multi_objective_aggregation": (
            lambda c: c.multi_objective_aggregation != "sum_then_normalize",
            "normalising each reward function on its own",
        ),
    }
    return [
        Conflict(
            switch,
            name,
            lambda c, switch=switch, gives=gives: getattr(c, switch) and gives(c),
            f"a group whose rewards do not vary still gets non-zero advantages from {what}, so skipping it as "
            "zero-signal would change the gradient.",
            f"set {switch}=False, or keep {name} at its default.",
        )
        for switch in SIGNAL_SWITCHES
        for name, (gives, what) in carriers.items()
    ]


CONFLICTS = (
    Conflict(
        "dual_clip_c",
        "loss_type",
        lambda c: c.dual_clip_c is not None and loss_types.REGISTRY[c.loss_type].surrogate != "clip",
        "dual-clip applies to clipped surrogates only.",
        "unset dual_clip_c, or use a clipped loss_type such as 'dapo' or 'grpo'.",
    ),
    Conflict(
        "loss_agg_mode",
        "loss_type",
        lambda c: c.loss_agg_mode is not None and c.loss_type not in loss_types.OWN_PATH_NAMES,
        "this loss_type fixes its own normaliser.",
        "use loss_type='grpo' (or 'gspo', 'dapo', 'cispo') with loss_agg_mode, or unset loss_agg_mode.",
    ),
    *(
        Conflict(
            own,
            name,
            lambda c, is_set=is_set: uses_own_loss(c) and is_set(c),
            "the own loss path (loss_agg_mode, turn-level ratios) does not implement it.",
            f"reset {name} to its default, or unset loss_agg_mode / use a token or sequence level.",
        )
        for own in ("loss_agg_mode", "importance_sampling_level")
        for name, is_set in (
            ("off_policy_mask_threshold", lambda c: c.off_policy_mask_threshold is not None),
            ("top_entropy_quantile", lambda c: c.top_entropy_quantile < 1.0),
            ("entropy_coef", entropy_bonus),
        )
    ),
    Conflict(
        "filter_zero_signal",
        "entropy_coef",
        lambda c: c.filter_zero_signal and entropy_bonus(c) and normalizer(c) == loss_types.ROWS,
        "this loss averages over rows, and filtering rescales that mean (pad rows must not dilute it), which would "
        "also rescale TRL's entropy bonus.",
        "use loss_type='dapo' (or loss_agg_mode='token-mean') with entropy_coef, or entropy_coef=0.0.",
    ),
    *(
        Conflict(
            "zero_signal_normalizer",
            name,
            lambda c, is_set=is_set: c.filter_zero_signal and c.zero_signal_normalizer == "all" and is_set(c),
            f"'all' promises the unfiltered gradient, but {what} over the trained rows only.",
            f"use zero_signal_normalizer='kept', or reset {name} to its default.",
        )
        for name, is_set, what in (
            ("entropy_coef", entropy_bonus, "TRL's entropy bonus is a token mean"),
            ("top_entropy_quantile", lambda c: c.top_entropy_quantile < 1.0, "the entropy quantile is taken"),
            ("beta", lambda c: c.beta != 0.0, "the KL term of a dropped row is not zero, and it is dropped"),
        )
    ),
    Conflict(
        "dynamic_sampling",
        "zero_signal_normalizer",
        lambda c: c.dynamic_sampling and c.zero_signal_normalizer != "kept",
        "'all' (the unfiltered batch) is not defined across dynamic-sampling rounds.",
        "use zero_signal_normalizer='kept' (DAPO normalises over the trained batch).",
    ),
    *_signal_conflicts(),
    Conflict(
        "selective_rollout",
        "reward_norm",
        lambda c: c.selective_rollout and c.reward_norm is not None,
        "selective rollout tells all-max from all-min groups by their reward value, which reward_norm rescales "
        "per batch or over time.",
        "unset reward_norm (reward_clip is fine), or set selective_rollout=False.",
    ),
    *(
        Conflict(
            "turn_advantages",
            name,
            lambda c, is_set=is_set: c.turn_advantages is not None and is_set(c),
            "per-turn rewards are used raw, so this reward or advantage transform would not apply to them.",
            f"reset {name} to its default or set turn_advantages=None.",
        )
        for name, is_set in (
            ("reward_clip", lambda c: c.reward_clip is not None),
            ("reward_norm", lambda c: c.reward_norm is not None),
            ("adv_norm", lambda c: c.adv_norm is not None),
            ("whiten_advantages", lambda c: c.whiten_advantages),
            ("adv_clip_range", lambda c: c.adv_clip_range is not None),
            ("token_level_kl_coef", lambda c: c.token_level_kl_coef > 0),
            ("multi_objective_aggregation", lambda c: c.multi_objective_aggregation != "sum_then_normalize"),
        )
    ),
    Conflict(
        "adv_norm",
        "scale_rewards",
        lambda c: c.adv_norm == "mean_std" and c.scale_rewards == "none",
        "'mean_std' needs a std scope but scale_rewards='none'.",
        "set scale_rewards='group'.",
    ),
    *(
        Conflict(
            "multi_objective_aggregation",
            name,
            lambda c, is_set=is_set: c.multi_objective_aggregation != "sum_then_normalize" and is_set(c),
            "'normalize_then_sum' builds its own advantages, which grpo_hub's advantage edits cannot edit.",
            f"use multi_objective_aggregation='sum_then_normalize' or reset {name} to its default.",
        )
        for name, is_set in ADVANTAGE_EDITS.items()
    ),
    Conflict(
        "vllm_adapter_sync",
        "vllm_mode",
        lambda c: c.vllm_adapter_sync and c.vllm_mode != "colocate",
        "adapter-only sync is built for colocate mode; a server would need the adapter through its own "
        "/v1/load_lora_adapter endpoint (docs/vllm.md).",
        "use vllm_mode='colocate', or set vllm_adapter_sync=False (TRL's merged sync).",
    ),
    Conflict(
        "vllm_adapter_sync",
        "vllm_enable_sleep_mode",
        lambda c: c.vllm_adapter_sync and c.vllm_enable_sleep_mode,
        "sleep mode discards the engine's base weights, which adapter-only sync loads once and never pushes again.",
        "set vllm_enable_sleep_mode=False, or vllm_adapter_sync=False.",
    ),
    Conflict(
        "vllm_is_pooling",
        "vllm_importance_sampling_mode",
        lambda c: (
            c.vllm_is_pooling is not None and not c.vllm_importance_sampling_mode.startswith("sequence_")
        ),
        "pooling turns token ratios into a sequence ratio, but the mode is token-level.",
        "use vllm_importance_sampling_mode='sequence_mask' or 'sequence_truncate'.",
    ),
)


def validate(c, checks=None, conflicts=CONFLICTS) -> None:
    """Phase 2: every feature's own checks on the resolved config, then every conflict (nothing is changed).

    `checks`/`conflicts` default to the table's; a test passes them reordered to show the order does not matter.
    """
    for check in checks or [check for f in FEATURES for check in f.checks]:
        check(c)
    for rule in conflicts:
        if rule.applies(c):
            conflict_error(rule.first, rule.second, rule.problem, rule.fix, implied_by=c.implied_by)
