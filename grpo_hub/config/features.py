"""Every grpo_hub feature, described once, as a row that owns it: its switch (`is_on`), the seams it touches, the
tags conflicts are derived from (grpo_hub.config.conflicts), its own value checks (feature_checks.py), and the
fields that need it.

The trainer and its helpers ask a row (`is_on(name, config)`, `any_on(tag, config)`) instead of re-deriving a
predicate on the config. docs/compatibility.md is generated from the rows that have an `example` (a setting that
switches the feature on), by building every pair of them (tests/config/test_compatibility.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from grpo_hub.config import feature_checks as checks

# --- seams: where a feature acts on TRL's step (the pairwise suite trains the pairs that share one) ---
REWARDS = "rewards"  # the rewards, transformed per function (seam 1) or read (advantages, zero-signal groups)
ADVANTAGES = "advantages"  # the scored batch's advantages (seam 2)
ROWS = "rows"  # which rows of a generation batch train, and in which micro-step
GENERATION = "generation"  # which prompts are generated, or by what engine
LOSS = "loss"  # the surrogate, its ratio, its KL term, its aggregation or denominator (seam 3)
REFERENCE = "reference"  # the reference policy's log-probs
FORWARD = "forward"  # how a micro-batch's tokens reach the model (the log-probs are the same)
SCHEDULE = "schedule"  # the run's length and its learning-rate schedule
SEAMS = (REWARDS, ADVANTAGES, ROWS, GENERATION, LOSS, REFERENCE, FORWARD, SCHEDULE)

# --- tags: what a feature does that another may contradict (the rules live in conflicts.py) ---
EDITS_REWARDS = "edits each reward function's rewards before TRL's advantages"
RESCALES_REWARDS = "rescales rewards per batch or over time"
READS_REWARD_VALUES = "tells groups apart by their reward value"
EDITS_ADVANTAGES = "edits the advantages grpo_hub recomputes"
BUILDS_ADVANTAGES = "builds the advantages its own way"
PER_TURN_REWARDS = "uses each turn's raw rewards"
FLAT_GROUP_SIGNAL = "gives a group whose rewards do not vary non-zero advantages"
SKIPS_FLAT_GROUPS = "skips groups whose rewards do not vary"
PACKS_ROWS = "moves rows between micro-steps"
ALL_ROWS_DENOMINATOR = "divides the loss by the rows before dropping"
MICRO_BATCH_MEAN = "is a mean or quantile over the rows of each micro-batch"
OWN_LOSS = "runs grpo_hub's own loss path"
TRL_LOSS_ONLY = "is implemented in TRL's loss only"
NEEDS_REFERENCE = "needs reference log-probs"
TURN_BY_TURN_GENERATION = "generates each turn after the previous turn's tool results"
GENERATES_AHEAD = "generates batches before the policy that trains them exists"
RAGGED_GROUPS = "gives prompts different numbers of completions"
FIXED_GROUPS = "reads each prompt's group as num_generations consecutive rows"
PREDICTS_FROM_HISTORY = "predicts a prompt's outcome from its earlier groups"
HINTS_ROLLOUTS = "starts some rollouts from the first steps of the reference solution"
TAGS = (
    EDITS_REWARDS,
    RESCALES_REWARDS,
    READS_REWARD_VALUES,
    EDITS_ADVANTAGES,
    BUILDS_ADVANTAGES,
    PER_TURN_REWARDS,
    FLAT_GROUP_SIGNAL,
    SKIPS_FLAT_GROUPS,
    PACKS_ROWS,
    ALL_ROWS_DENOMINATOR,
    MICRO_BATCH_MEAN,
    OWN_LOSS,
    TRL_LOSS_ONLY,
    NEEDS_REFERENCE,
    TURN_BY_TURN_GENERATION,
    GENERATES_AHEAD,
    RAGGED_GROUPS,
    FIXED_GROUPS,
    PREDICTS_FROM_HISTORY,
    HINTS_ROLLOUTS,
)


@dataclass(frozen=True)
class Dependents:
    """Fields that have an effect only when `holds(config)`; `needs` says what that takes, in words."""

    fields: tuple[str, ...]
    needs: str
    holds: Callable


@dataclass(frozen=True)
class Feature:
    """One feature. `field` is the setting errors name; `tags` maps a tag to how this feature does it, in words."""

    name: str
    field: str
    is_on: Callable  # on the resolved config
    example: dict | None  # a setting that switches it on (compatibility matrix); None: not in the matrix
    seams: tuple[str, ...]
    tags: dict = field(default_factory=dict)
    checks: tuple[Callable, ...] = ()  # the feature's own value checks on the resolved config (any value)
    dependents: tuple[Dependents, ...] = ()
    page: str = ""  # docs page
    needs_peft: bool = False  # the example trains only a PEFT model
    multi_turn: bool = False  # the example trains only on tool-calling rollouts (per-turn rewards)
    trains: bool = True  # False: needs what the CPU test machine lacks (vLLM), so config-time only


def _uses_server(c) -> bool:
    return c.use_vllm and c.vllm_mode == "server"


def _skips_flat_groups(c) -> bool:
    return any_on(SKIPS_FLAT_GROUPS, c)


FEATURES = (
    Feature(
        "policy_loss",
        "loss_type",
        lambda c: True,
        None,
        (LOSS,),
        checks=(checks.check_loss_type, checks.check_clip),
        page="variants.md",
    ),
    Feature(
        "gspo",
        "loss_type",
        lambda c: c.importance_sampling_level == "sequence",
        {"loss_type": "gspo"},
        (LOSS,),
        page="variants.md",
    ),
    Feature(
        "cispo",
        "loss_type",
        lambda c: c.loss_type == "cispo",
        {"loss_type": "cispo"},
        (LOSS,),
        page="variants.md",
    ),
    Feature(
        "dual_clip",
        "dual_clip_c",
        lambda c: c.dual_clip_c is not None,
        {"dual_clip_c": 3.0},
        (LOSS,),
        checks=(checks.check_dual_clip,),
        page="variants.md",
    ),
    Feature(
        "loss_agg_mode",
        "loss_agg_mode",
        lambda c: c.loss_agg_mode is not None,
        {"loss_agg_mode": "seq-mean-token-sum"},
        (LOSS,),
        {OWN_LOSS: "loss_agg_mode"},
        checks=(checks.check_loss_agg,),
        page="variants.md",
    ),
    Feature(
        "turn_ratios",
        "importance_sampling_level",
        lambda c: c.importance_sampling_level == "turn",
        None,
        (LOSS,),
        {
            OWN_LOSS: "turn-level ratios",
            TURN_BY_TURN_GENERATION: "turn-level ratios need tool-calling rollouts",
        },
        checks=(checks.check_ratio_level,),
        page="multi-turn.md",
        multi_turn=True,
    ),
    Feature(
        "filtering",
        "filter_zero_signal",
        lambda c: c.filter_zero_signal,
        {"filter_zero_signal": True},
        (REWARDS, ROWS, LOSS),
        {SKIPS_FLAT_GROUPS: "filtering"},
        checks=(checks.check_filtering,),
        dependents=(
            Dependents(
                ("zero_signal_eps",),
                "filter_zero_signal=True, dynamic_sampling=True or selective_rollout=True",
                _skips_flat_groups,
            ),
            Dependents(
                ("zero_signal_normalizer", "zero_signal_pack"),
                "filter_zero_signal=True or dynamic_sampling=True",
                lambda c: is_on("filtering", c),
            ),
        ),
        page="filtering.md",
    ),
    Feature(
        "packing",
        "zero_signal_pack",
        lambda c: bool(c.filter_zero_signal and c.zero_signal_pack),
        {"filter_zero_signal": True, "zero_signal_pack": True},
        (ROWS, LOSS),
        {PACKS_ROWS: "packing"},
        page="filtering.md",
    ),
    Feature(
        "unfiltered_denominator",
        "zero_signal_normalizer",
        lambda c: c.filter_zero_signal and c.zero_signal_normalizer == "all",
        None,
        (ROWS, LOSS),
        {ALL_ROWS_DENOMINATOR: "'all'"},
        page="filtering.md",
    ),
    Feature(
        "padding_free",
        "padding_free",
        lambda c: c.padding_free,
        {"padding_free": True},
        (FORWARD,),
        checks=(checks.check_padding_free,),
        dependents=(Dependents(("shared_prompts",), "padding_free=True", lambda c: c.padding_free),),
        page="padding-free.md",
    ),
    Feature(
        "shared_prompts",
        "shared_prompts",
        lambda c: c.padding_free and c.shared_prompts,
        {"padding_free": True, "shared_prompts": True},
        (FORWARD,),
        dependents=(
            Dependents(
                ("shared_prompts_whole_groups",),
                "padding_free=True and shared_prompts=True",
                lambda c: is_on("shared_prompts", c),
            ),
        ),
        page="padding-free.md#shared-prompts",
    ),
    Feature(
        "whole_groups",
        "shared_prompts_whole_groups",
        lambda c: is_on("shared_prompts", c) and bool(c.shared_prompts_whole_groups),
        {
            "padding_free": True,
            "shared_prompts": True,
            "shared_prompts_whole_groups": True,
            "gradient_accumulation_steps": 2,  # two micro-batches per optimizer step to regroup
        },
        (ROWS,),
        {PACKS_ROWS: "keeping each prompt's rows together"},
        checks=(checks.check_whole_groups,),
        page="padding-free.md#whole-groups",
    ),
    Feature(
        "time_budget",
        "time_budget_seconds",
        lambda c: c.time_budget_seconds is not None,
        {"time_budget_seconds": 3600.0},  # (the tiny runs end long before: the plan is the upper bound)
        (SCHEDULE,),
        checks=(checks.check_time_budget,),
        dependents=(
            Dependents(
                ("time_budget_calibration_steps",),
                "time_budget_seconds",
                lambda c: is_on("time_budget", c),
            ),
        ),
        page="time-budget.md",
    ),
    Feature(
        "dynamic_sampling",
        "dynamic_sampling",
        lambda c: c.dynamic_sampling,
        {"dynamic_sampling": True},
        (REWARDS, ROWS, GENERATION, LOSS),
        {
            SKIPS_FLAT_GROUPS: "dynamic sampling",
            FIXED_GROUPS: "dynamic sampling counts and keeps whole groups",
        },
        checks=(checks.check_dynamic_sampling,),
        dependents=(
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
        "selective_rollout",
        lambda c: c.selective_rollout,
        {"selective_rollout": True},
        (REWARDS, ROWS, GENERATION),
        {
            SKIPS_FLAT_GROUPS: "selective rollout",
            READS_REWARD_VALUES: "selective rollout tells all-max from all-min groups by their reward value",
            FIXED_GROUPS: "selective rollout skips and replaces whole groups",
            PREDICTS_FROM_HISTORY: "selective rollout skips the prompts whose earlier groups were all wrong",
        },
        checks=(checks.check_selective_rollout,),
        dependents=(
            Dependents(
                tuple(
                    f"selective_rollout_{name}"
                    for name in (
                        "mode",
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
        "selective_shrink",
        "selective_rollout_mode",
        lambda c: c.selective_rollout and c.selective_rollout_mode == "shrink",
        {"selective_rollout": True, "selective_rollout_mode": "shrink"},
        (ROWS, GENERATION, LOSS),  # fewer groups generated and trained; the loss averages over them
        {},
        page="selective-rollout.md",
    ),
    Feature(
        "rollout_budget",
        "rollout_budget",
        lambda c: c.rollout_budget != "uniform",
        {"rollout_budget": "knapsack"},
        (REWARDS, ADVANTAGES, GENERATION),
        {
            RAGGED_GROUPS: "per-prompt rollout budgets",
            EDITS_ADVANTAGES: "per-prompt rollout budgets (each group's own completions)",
            READS_REWARD_VALUES: "per-prompt rollout budgets count a completion as solved by its reward value",
            PREDICTS_FROM_HISTORY: "per-prompt rollout budgets estimate each prompt's success from its earlier groups",
        },
        checks=(checks.check_rollout_budget,),
        dependents=(
            Dependents(
                (
                    "rollout_budget_min",
                    "rollout_budget_max",
                    "rollout_budget_column",
                    "rollout_budget_success_threshold",
                ),
                "rollout_budget='knapsack' or 'signal'",
                lambda c: is_on("rollout_budget", c),
            ),
        ),
        page="rollout-budget.md",
    ),
    Feature(
        "hints",
        "hint_column",
        lambda c: c.hint_column is not None,
        {"hint_column": "solution"},
        (REWARDS, GENERATION),  # the prompts generated from, and what reward functions get
        {
            HINTS_ROLLOUTS: "hints start a prompt's rollouts from its solution's first steps",
        },
        checks=(checks.check_hints,),
        dependents=(
            Dependents(
                (
                    "hint_separator",
                    "hint_group_column",
                    "hint_success_threshold",
                    "hint_shorten_at",
                    "hint_window",
                    "hint_end",
                ),
                "hint_column='<solution column>'",
                lambda c: is_on("hints", c),
            ),
        ),
        page="hints.md",
    ),
    Feature(
        "ref_adapter_refresh",
        "ref_adapter_sync_on",
        lambda c: c.ref_adapter_sync_on != "never",
        {"ref_adapter_sync_on": "steps", "ref_adapter_sync_steps": 1, "beta": 0.04},
        (REFERENCE, LOSS),
        checks=(checks.check_reference_adapter,),
        dependents=(
            Dependents(
                ("ref_adapter_sync_steps",),
                "ref_adapter_sync_on='steps'",
                lambda c: c.ref_adapter_sync_on == "steps",
            ),
            Dependents(
                ("ref_adapter_mixup_alpha",),
                "ref_adapter_sync_on='steps' or 'epoch'",
                lambda c: is_on("ref_adapter_refresh", c),
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
        "turn_advantages",
        lambda c: c.turn_advantages is not None,
        {"turn_advantages": "turn"},
        (REWARDS, ADVANTAGES),
        {
            BUILDS_ADVANTAGES: "per-turn advantages",
            PER_TURN_REWARDS: "per-turn rewards are used raw",
            FLAT_GROUP_SIGNAL: "per-turn rewards",
            TURN_BY_TURN_GENERATION: "per-turn advantages need tool-calling rollouts",
        },
        checks=(checks.check_turn_advantages,),
        page="multi-turn.md",
        multi_turn=True,
    ),
    Feature(
        "reward_clip",
        "reward_clip",
        lambda c: c.reward_clip is not None,
        {"reward_clip": 0.5},
        (REWARDS,),
        {EDITS_REWARDS: "reward_clip"},
        checks=(checks.check_reward_clip,),
        page="variants.md",
    ),
    Feature(
        "reward_norm",
        "reward_norm",
        lambda c: c.reward_norm is not None,
        {"reward_norm": "batch"},
        (REWARDS,),
        {EDITS_REWARDS: "reward_norm", RESCALES_REWARDS: "reward_norm"},
        checks=(checks.check_reward_norm,),
        dependents=(
            Dependents(
                ("reward_shift", "reward_scale"),
                "reward_norm='batch' or 'running'",
                lambda c: is_on("reward_norm", c),
            ),
        ),
        page="variants.md",
    ),
    Feature(
        "kl_in_reward",
        "token_level_kl_coef",
        lambda c: c.token_level_kl_coef > 0,
        {"token_level_kl_coef": 0.01, "beta": 0.04},
        (REWARDS, ADVANTAGES, REFERENCE, LOSS),
        {
            EDITS_ADVANTAGES: "the KL in the reward",
            FLAT_GROUP_SIGNAL: "the KL in the reward",
            NEEDS_REFERENCE: "the KL in the reward",
        },
        checks=(checks.check_kl_in_reward,),
        page="variants.md",
    ),
    Feature(
        "adv_norm",
        "adv_norm",
        lambda c: c.adv_norm == "no_baseline",
        {"adv_norm": "no_baseline"},
        (REWARDS, ADVANTAGES),
        {EDITS_ADVANTAGES: "adv_norm='no_baseline'", FLAT_GROUP_SIGNAL: "adv_norm='no_baseline' (A = r)"},
        checks=(checks.check_adv_norm,),
        page="variants.md",
    ),
    Feature(
        "whiten_advantages",
        "whiten_advantages",
        lambda c: c.whiten_advantages,
        {"whiten_advantages": True},
        (REWARDS, ADVANTAGES),
        {EDITS_ADVANTAGES: "whitening", FLAT_GROUP_SIGNAL: "whitening over the batch"},
        page="variants.md",
    ),
    Feature(
        "adv_clip",
        "adv_clip_range",
        lambda c: c.adv_clip_range is not None,
        {"adv_clip_range": 1.0},
        (REWARDS, ADVANTAGES),
        {EDITS_ADVANTAGES: "advantage clipping"},
        checks=(checks.check_adv_clip,),
        page="variants.md",
    ),
    Feature(
        "multi_objective",
        "multi_objective_aggregation",
        lambda c: c.multi_objective_aggregation != "sum_then_normalize",
        None,
        (REWARDS, ADVANTAGES),
        {
            BUILDS_ADVANTAGES: "'normalize_then_sum'",
            FLAT_GROUP_SIGNAL: "normalising each reward function on its own",
        },
    ),
    Feature(
        "entropy_bonus",
        "entropy_coef",
        lambda c: c.entropy_coef != 0.0 or c.use_adaptive_entropy,
        {"entropy_coef": 0.01},
        (LOSS,),
        {
            TRL_LOSS_ONLY: "TRL's entropy bonus",
            MICRO_BATCH_MEAN: "TRL's entropy bonus is a token mean over each micro-batch",
        },
        page="variants.md",
    ),
    Feature(
        "top_entropy",
        "top_entropy_quantile",
        lambda c: c.top_entropy_quantile < 1.0,
        None,
        (LOSS,),
        {
            TRL_LOSS_ONLY: "TRL's entropy mask",
            MICRO_BATCH_MEAN: "the entropy quantile is taken over each micro-batch",
        },
    ),
    Feature(
        "off_policy_mask",
        "off_policy_mask_threshold",
        lambda c: c.off_policy_mask_threshold is not None,
        None,
        (LOSS,),
        {TRL_LOSS_ONLY: "TRL's off-policy mask"},
    ),
    Feature(
        "vllm_is",
        "vllm_importance_sampling_correction",
        lambda c: c.use_vllm and c.vllm_importance_sampling_correction,
        {"use_vllm": True, "vllm_importance_sampling_mode": "sequence_mask", "vllm_is_pooling": "mean"},
        (GENERATION, LOSS),
        checks=(checks.check_vllm_is,),
        dependents=(
            Dependents(
                ("vllm_is_pooling", "vllm_is_preset"),
                "use_vllm=True and vllm_importance_sampling_correction=True",
                lambda c: is_on("vllm_is", c),
            ),
        ),
        page="vllm.md",
        trains=False,
    ),
    Feature(
        "vllm_adapter_sync",
        "vllm_adapter_sync",
        lambda c: c.use_vllm and c.vllm_adapter_sync,
        {"use_vllm": True, "vllm_adapter_sync": True},
        (GENERATION,),
        dependents=(Dependents(("vllm_adapter_sync",), "use_vllm=True", lambda c: c.use_vllm),),
        page="vllm.md",
        needs_peft=True,
        trains=False,
    ),
    Feature(
        "vllm_server_sync",
        "vllm_server_sync",
        lambda c: _uses_server(c),
        {"use_vllm": True, "vllm_mode": "server", "vllm_server_sync": "merged"},
        (GENERATION,),
        checks=(checks.check_vllm_server_sync,),
        dependents=(
            Dependents(
                ("vllm_server_sync", "vllm_server_sync_dir", "max_staleness"),
                "use_vllm=True and vllm_mode='server'",
                lambda c: _uses_server(c),
            ),
        ),
        page="vllm.md",
        trains=False,
    ),
    Feature(
        "async_rollouts",
        "max_staleness",
        lambda c: _uses_server(c) and c.max_staleness > 0,
        {"use_vllm": True, "vllm_mode": "server", "max_staleness": 1},
        (GENERATION, LOSS),
        {GENERATES_AHEAD: "asynchronous rollouts generate a batch before the policy that trains it"},
        checks=(checks.check_max_staleness,),
        page="async.md",
        trains=False,
    ),
)
BY_NAME = {f.name: f for f in FEATURES}
SWITCHES = {f.name: f for f in FEATURES if f.example is not None}  # the features a user turns on


def is_on(name: str, config) -> bool:
    """Whether the feature `name` is on in the resolved `config`."""
    return bool(BY_NAME[name].is_on(config))


def tagged(tag: str) -> tuple[Feature, ...]:
    return tuple(f for f in FEATURES if tag in f.tags)


def any_on(tag: str, config) -> bool:
    """Whether a feature carrying `tag` is on."""
    return any(f.is_on(config) for f in tagged(tag))


def pair_settings(first: str, second: str) -> dict | None:
    """Both switches' example settings together, or None when they set one field to two values (then the two are
    alternatives, not a pair: e.g. the gspo and cispo presets). The compatibility test and page build these."""
    a, b = SWITCHES[first].example, SWITCHES[second].example
    if any(key in b and b[key] != value for key, value in a.items()):
        return None
    return {**a, **b}


def share_a_seam(first: str, second: str) -> bool:
    return bool(set(BY_NAME[first].seams) & set(BY_NAME[second].seams))


def effect_needs() -> dict[str, tuple[str, Callable]]:
    """field -> (what it needs, predicate): a field set away from its default with the predicate False is an error."""
    return {name: (d.needs, d.holds) for f in FEATURES for d in f.dependents for name in d.fields}
