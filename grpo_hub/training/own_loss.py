"""The own loss path: what TRL's `_compute_loss` lacks (ROLL/verl `loss_agg_mode`, turn-level ratio pooling).

The trainer's `_compute_loss` seam calls `own_loss` only when `GRPOHubConfig.uses_own_loss`; it passes TRL's
forward (`_get_per_token_logps_and_entropies`) as a callable, the settings as `OwnLossSettings`, the normaliser
(`grpo_hub.algos.normalizer.micro_batch_normalizer`, bound to the step's counts) and the metrics. The surrogate
comes from the loss-type registry (`grpo_hub.algos.loss_types`), the formulas from `grpo_hub.algos.losses`.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo_hub.algos import loss_types, losses
from grpo_hub.training.turns import turn_ids_from_tool_mask


@dataclass(frozen=True)
class OwnLossSettings:
    loss_type: str  # registry name (TRL's resolved loss type)
    loss_agg_mode: str | None
    importance_sampling_level: str  # token, sequence or turn
    epsilon_low: float
    epsilon_high: float
    dual_clip_c: float | None
    beta: float
    use_bias_correction_kl: bool
    max_completion_length: int

    @property
    def surrogate(self) -> str:
        return loss_types.REGISTRY[self.loss_type].surrogate

    @property
    def agg_mode(self) -> str:
        return loss_types.own_path_agg_mode(self.loss_type, self.loss_agg_mode)


def own_loss(
    inputs: dict,
    logps_and_entropies: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
    settings: OwnLossSettings,
    normalizer: Callable[[str, torch.Tensor], torch.Tensor],
    metrics: dict,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Clipped (or CISPO) surrogate with turn/token/sequence ratio pooling, aggregated by `loss_agg_mode`.

    `logps_and_entropies(input_ids, attention_mask, logits_to_keep)` -> per-token log-probs and entropies of
    the policy; `normalizer(kind, count)` -> the micro-batch's normaliser (`micro_batch_normalizer`) where
    `count` is the rows (ROWS) or loss tokens the aggregation averaged over; `reduce_sum` sums over ranks.
    """
    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    mask = completion_mask * inputs.get("tool_mask", 1)
    per_token_logps, entropies = logps_and_entropies(
        torch.cat([inputs["prompt_ids"], completion_ids], dim=1),
        torch.cat([inputs["prompt_mask"], completion_mask], dim=1),
        completion_ids.size(1),
    )
    advantages = inputs["advantages"]
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    old_logps = inputs.get("old_per_token_logps")
    old_logps = per_token_logps.detach() if old_logps is None else old_logps
    level = settings.importance_sampling_level
    tool_mask = inputs.get("tool_mask", torch.ones_like(completion_mask))  # no tool call: one turn
    turn_ids = turn_ids_from_tool_mask(tool_mask) if level == "turn" else None
    log_ratio = losses.pool_log_ratio(per_token_logps - old_logps, mask, level=level, turn_ids=turn_ids)
    ratio = torch.exp(log_ratio)
    if settings.surrogate == "cispo":
        per_token_loss = losses.cispo_loss(ratio, advantages, per_token_logps, high=settings.epsilon_high)
    elif settings.surrogate == "clip":
        per_token_loss = losses.clipped_surrogate(
            ratio, advantages, settings.epsilon_low, settings.epsilon_high, dual_clip=settings.dual_clip_c
        )
    else:
        raise ValueError(f"the own loss path has no {settings.surrogate!r} surrogate ({settings.loss_type})")
    if "importance_sampling_ratio" in inputs:
        per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
    per_token_kl = None
    if settings.beta != 0.0:
        per_token_kl = losses.kl_penalty(per_token_logps, inputs["ref_per_token_logps"], kind="k3")
        if settings.use_bias_correction_kl:
            per_token_kl = per_token_kl * ratio
        per_token_loss = per_token_loss + settings.beta * per_token_kl
    loss = aggregate(per_token_loss, mask, settings, normalizer)
    log_metrics(ratio, advantages, mask, entropies, per_token_kl, settings, metrics, reduce_sum)
    return loss


def aggregate(per_token_loss, mask, settings: OwnLossSettings, normalizer) -> torch.Tensor:
    """`loss_agg_mode` (default: grpo -> seq-mean-token-mean, dapo/cispo -> token-mean) for one micro-batch.

    The mean `aggregate_loss` takes over the micro-batch is turned back into a sum (× the rows or tokens it
    averaged over) and divided by the normaliser: token-mean by BATCH_TOKENS (the loss tokens of the whole
    generation batch, so it does not depend on how rows fall into micro-batches), seq-mean modes by ROWS.
    """
    agg_mode = settings.agg_mode
    loss = losses.aggregate_loss(per_token_loss, mask, agg_mode, norm_length=settings.max_completion_length)
    if agg_mode in losses.SEQ_MEAN_AGG_MODES:
        rows_averaged = (mask.sum(dim=1) > 0).sum().clamp(min=1)  # aggregate_loss skips empty rows
        return loss * rows_averaged / normalizer(loss_types.ROWS, rows_averaged)
    tokens = mask.sum().clamp(min=1.0)
    return loss * tokens / normalizer(loss_types.BATCH_TOKENS, tokens)


def log_metrics(ratio, advantages, mask, entropies, per_token_kl, settings, metrics, reduce_sum) -> None:
    """Entropy, KL and clip fractions as token means over all ranks (TRL's metric names)."""

    def global_mean(x):
        x = x.expand_as(mask)
        totals = reduce_sum(torch.stack([(x * mask).sum(), mask.sum().float()]))
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    metrics["entropy"].append(global_mean(entropies))
    if per_token_kl is not None:
        metrics["kl"].append(global_mean(per_token_kl))
    ratio = ratio.detach()
    if settings.surrogate == "cispo":
        metrics["cispo_clip_ratio"].append(
            global_mean(((ratio > settings.epsilon_high) & (advantages > 0)).float())
        )
        return
    low = (ratio < 1 - settings.epsilon_low) & (advantages < 0)
    high = (ratio > 1 + settings.epsilon_high) & (advantages > 0)
    metrics["clip_ratio/low_mean"].append(global_mean(low.float()))
    metrics["clip_ratio/high_mean"].append(global_mean(high.float()))
    metrics["clip_ratio/region_mean"].append(global_mean((low | high).float()))
    if settings.dual_clip_c is not None:
        dual = (ratio > settings.dual_clip_c) & (advantages < 0)
        metrics["clip_ratio/dual_mean"].append(global_mean(dual.float()))
