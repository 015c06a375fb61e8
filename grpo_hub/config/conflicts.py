"""Pairs of settings refused together, each error naming both fields.

Most conflicts follow from the features' tags (grpo_hub.config.features): a `TagRule` refuses every pair of
features, one carrying each tag, when both are on, so a new feature row that carries a tag gets its conflicts
without another edit. `EXCEPTIONS` are the conflicts a tag cannot express (they hinge on a value, not a switch),
each with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grpo_hub.algos import loss_types
from grpo_hub.config import features as F


@dataclass(frozen=True)
class Conflict:
    """`first` and `second` together are refused when `applies(config)`; `problem` says why, `fix` what to do."""

    first: str
    second: str
    applies: Callable
    problem: str
    fix: str


@dataclass(frozen=True)
class TagRule:
    """A feature tagged `first` and one tagged `second` are refused together. `problem` and `fix` are formatted
    with `first`/`second` (the fields) and `first_does`/`second_does` (each feature's words for its tag)."""

    first: str
    second: str
    problem: str
    fix: str


RULES = (
    TagRule(
        F.SKIPS_FLAT_GROUPS,
        F.FLAT_GROUP_SIGNAL,
        "a group whose rewards do not vary still gets non-zero advantages from {second_does}, so skipping it as "
        "zero-signal would change the gradient.",
        "set {first}=False, or keep {second} at its default.",
    ),
    TagRule(
        F.BUILDS_ADVANTAGES,
        F.EDITS_ADVANTAGES,
        "{first_does} are built their own way, which {second_does} cannot edit.",
        "reset {second} to its default, or {first} to its default.",
    ),
    TagRule(
        F.BUILDS_ADVANTAGES,
        F.BUILDS_ADVANTAGES,
        "{first_does} and {second_does} each build the advantages their own way.",
        "reset {second} to its default, or {first} to its default.",
    ),
    TagRule(
        F.PER_TURN_REWARDS,
        F.EDITS_REWARDS,
        "{first_does}, so {second_does} would not apply to them.",
        "reset {second} to its default or set {first}=None.",
    ),
    TagRule(
        F.READS_REWARD_VALUES,
        F.RESCALES_REWARDS,
        "{first_does}, which {second_does} rescales per batch or over time.",
        "reset {second} to its default, or set {first} to its default.",
    ),
    TagRule(
        F.OWN_LOSS,
        F.TRL_LOSS_ONLY,
        "the own loss path ({first_does}) does not implement {second_does}.",
        "reset {second} to its default, or reset {first} to its default.",
    ),
    TagRule(
        F.PACKS_ROWS,
        F.MICRO_BATCH_MEAN,
        "cannot apply: {second_does}, and {first_does} moves rows between micro-steps.",
        "leave {first} unset.",
    ),
    TagRule(
        F.GENERATES_AHEAD,
        F.TURN_BY_TURN_GENERATION,
        "{second_does}, and a turn cannot be generated before the previous turn's tool results exist.",
        "set {first}=0, or reset {second} to its default.",
    ),
    TagRule(
        F.RAGGED_GROUPS,
        F.FIXED_GROUPS,
        "{first_does} give prompts groups of different sizes, but {second_does} of num_generations rows.",
        "reset {first} to its default, or {second} to its default.",
    ),
    TagRule(
        F.HINTS_ROLLOUTS,
        F.PREDICTS_FROM_HISTORY,
        "{first_does}, so a prompt's earlier outcomes depend on the hint it had, and {second_does}: it would act on "
        "the prompts hints are for by outcomes they no longer have.",
        "set {first}=None, or reset {second} to its default.",
    ),
    TagRule(
        F.HINTS_ROLLOUTS,
        F.TURN_BY_TURN_GENERATION,
        "{first_does}, written as the start of one text answer, but {second_does}, generated turn by turn.",
        "set {first}=None, or reset {second} to its default.",
    ),
    TagRule(
        F.ALL_ROWS_DENOMINATOR,
        F.MICRO_BATCH_MEAN,
        "'all' promises the unfiltered gradient, but {second_does}, over the trained rows only.",
        "use {first}='kept', or reset {second} to its default.",
    ),
)


def derived(rule: TagRule) -> list[Conflict]:
    """The conflicts of `rule`: one per pair of distinct features carrying its two tags."""
    return [
        Conflict(
            a.field,
            b.field,
            lambda c, a=a, b=b: a.is_on(c) and b.is_on(c),
            rule.problem.format(
                first=a.field, second=b.field, first_does=a.tags[rule.first], second_does=b.tags[rule.second]
            ),
            rule.fix.format(first=a.field, second=b.field),
        )
        for a in F.tagged(rule.first)
        for b in F.tagged(rule.second)
        if a.name < b.name or rule.first != rule.second
    ]


def micro_tokens_loss(c) -> bool:
    return c.loss_denominator == loss_types.MICRO_TOKENS


def moves_rows_exactly(c) -> bool:
    """Whether moving rows between the micro-steps of one optimizer step leaves the gradient as it is (the default of
    zero_signal_pack and shared_prompts_whole_groups); an unknown loss_type (refused by validation) counts as no."""
    return c.loss_type in loss_types.REGISTRY and not pack_blockers(c)


def pack_blockers(c) -> list[str]:
    """The fields under which moving rows between micro-steps changes the gradient (zero_signal_pack's default)."""
    blockers = [f.field for f in F.tagged(F.MICRO_BATCH_MEAN) if f.is_on(c)]
    return (["loss_type"] if micro_tokens_loss(c) else []) + blockers


EXCEPTIONS = (
    # a value of loss_type, not a switch: the surrogate decides whether a dual clip exists
    Conflict(
        "dual_clip_c",
        "loss_type",
        lambda c: F.is_on("dual_clip", c) and not loss_types.REGISTRY[c.loss_type].surrogate.dual_clip,
        "dual-clip applies to clipped surrogates only.",
        "unset dual_clip_c, or use a clipped loss_type such as 'dapo' or 'grpo'.",
    ),
    # a value of loss_type: the own loss path computes only some loss types
    *(
        Conflict(
            own.field,
            "loss_type",
            lambda c, own=own: own.is_on(c) and c.loss_type not in loss_types.OWN_PATH_NAMES,
            f"{own.tags[F.OWN_LOSS]} runs the own loss path, which computes loss_type in "
            f"{loss_types.OWN_PATH_NAMES} only; this loss_type fixes its own denominator.",
            f"use loss_type='grpo' (or 'gspo', 'dapo', 'cispo') with {own.field}, or reset {own.field}.",
        )
        for own in F.tagged(F.OWN_LOSS)
    ),
    # a value of loss_type: bnpo divides by the micro-batch's own tokens, so no row may change micro-step
    *(
        Conflict(
            mover.field,
            "loss_type",
            lambda c, mover=mover: mover.is_on(c) and micro_tokens_loss(c),
            "cannot apply: this loss_type (bnpo) is a token mean over each micro-batch.",
            f"leave {mover.field} unset.",
        )
        for mover in F.tagged(F.PACKS_ROWS)
    ),
    # a value of the loss denominator: with a row mean, filtering rescales the mean, and TRL's bonus with it
    Conflict(
        "filter_zero_signal",
        "entropy_coef",
        lambda c: (
            F.is_on("filtering", c) and F.is_on("entropy_bonus", c) and c.loss_denominator == loss_types.ROWS
        ),
        "this loss averages over rows, and filtering rescales that mean (pad rows must not dilute it), which would "
        "also rescale TRL's entropy bonus.",
        "use loss_type='dapo' (or loss_agg_mode='token-mean') with entropy_coef, or entropy_coef=0.0.",
    ),
    # a value of beta: a dropped row's KL term is not zero
    Conflict(
        "zero_signal_normalizer",
        "beta",
        lambda c: F.is_on("unfiltered_denominator", c) and c.beta != 0.0,
        "'all' promises the unfiltered gradient, but the KL term of a dropped row is not zero, and it is dropped.",
        "use zero_signal_normalizer='kept', or reset beta to its default.",
    ),
    # a value of zero_signal_normalizer: dynamic sampling trains rows of several rounds
    Conflict(
        "dynamic_sampling",
        "zero_signal_normalizer",
        lambda c: F.is_on("dynamic_sampling", c) and c.zero_signal_normalizer != "kept",
        "'all' (the unfiltered batch) is not defined across dynamic-sampling rounds.",
        "use zero_signal_normalizer='kept' (DAPO normalises over the trained batch).",
    ),
    # any value of adv_norm: per-turn credit follows scale_rewards and never reads adv_norm
    Conflict(
        "turn_advantages",
        "adv_norm",
        lambda c: F.is_on("turn_advantages", c) and c.adv_norm is not None,
        "per-turn advantages are normalised as scale_rewards says and never read adv_norm.",
        "reset adv_norm to its default or set turn_advantages=None.",
    ),
    # values of adv_norm and scale_rewards (TRL's field)
    Conflict(
        "adv_norm",
        "scale_rewards",
        lambda c: c.adv_norm == "mean_std" and c.scale_rewards == "none",
        "'mean_std' needs a std scope but scale_rewards='none'.",
        "set scale_rewards='group'.",
    ),
    # a value of vllm_server_sync: vllm_adapter_sync in server mode means 'adapter'
    Conflict(
        "vllm_adapter_sync",
        "vllm_server_sync",
        lambda c: (
            F.is_on("vllm_adapter_sync", c)
            and F.is_on("vllm_server_sync", c)
            and c.vllm_server_sync in ("merged", "nccl")
        ),
        "adapter-only sync sends the adapter over HTTP; 'merged' and 'nccl' (TRL's sync) send the merged weights.",
        "keep one: vllm_adapter_sync=False, or vllm_server_sync='adapter'.",
    ),
    Conflict(
        "max_staleness",
        "vllm_server_sync",
        lambda c: F.is_on("async_rollouts", c) and c.vllm_server_sync == "nccl",
        "asynchronous rollouts sync over HTTP while requests run; TRL's NCCL sync is not built for that.",
        "use vllm_server_sync='auto', 'merged' or 'adapter', or max_staleness=0.",
    ),
    # a value of TRL's IS switch: a stale row is off-policy, and only the IS weight corrects it
    Conflict(
        "max_staleness",
        "vllm_importance_sampling_correction",
        lambda c: F.is_on("async_rollouts", c) and not c.vllm_importance_sampling_correction,
        "rows generated by an older policy need the importance-sampling weight pi_theta / pi_sampler to keep the "
        "update off-policy-correct.",
        "set vllm_importance_sampling_correction=True (TRL's default), or max_staleness=0.",
    ),
    # selective rollout predicts a prompt's signal from the rewards of the generation it just launched
    Conflict(
        "max_staleness",
        "selective_rollout",
        lambda c: F.is_on("async_rollouts", c) and F.is_on("selective_rollout", c),
        "selective rollout decides which prompts to generate from the rewards of the step before, which an "
        "asynchronous batch launched max_staleness steps earlier has not seen (not built).",
        "set max_staleness=0, or selective_rollout=False (dynamic sampling composes with asynchronous rollouts).",
    ),
    # a value of TRL's vllm_enable_sleep_mode: sleeping drops the base weights the engine loaded once
    Conflict(
        "vllm_adapter_sync",
        "vllm_enable_sleep_mode",
        lambda c: F.is_on("vllm_adapter_sync", c) and c.vllm_enable_sleep_mode,
        "sleep mode discards the engine's base weights, which adapter-only sync loads once and never pushes again.",
        "set vllm_enable_sleep_mode=False, or vllm_adapter_sync=False.",
    ),
    # values of vllm_is_pooling and TRL's mode
    Conflict(
        "vllm_is_pooling",
        "vllm_importance_sampling_mode",
        lambda c: (
            c.vllm_is_pooling is not None and not c.vllm_importance_sampling_mode.startswith("sequence_")
        ),
        "pooling turns token ratios into a sequence ratio, but the mode is token-level.",
        "use vllm_importance_sampling_mode='sequence_mask' or 'sequence_truncate'.",
    ),
    # TRL's use_vllm: TRL asks vLLM for num_generations completions of every num_generations-th prompt
    Conflict(
        "rollout_budget",
        "use_vllm",
        lambda c: F.is_on("rollout_budget", c) and c.use_vllm,
        "TRL's vLLM path requests num_generations completions per prompt (n per request), not a budget per prompt.",
        "set rollout_budget='uniform', or use_vllm=False (HF generate gives each row its own completion).",
    ),
)

# dynamic_sampling implies filter_zero_signal: a conflict naming the implied switch comes after one naming the switch
# the user set
IMPLIED_SWITCHES = ("filter_zero_signal",)
CONFLICTS = (
    *sorted((c for rule in RULES for c in derived(rule)), key=lambda c: c.first in IMPLIED_SWITCHES),
    *EXCEPTIONS,
)
