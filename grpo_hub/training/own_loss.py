"""The own loss path: what TRL's `_compute_loss` lacks (ROLL/verl `loss_agg_mode`, turn-level ratio pooling).

The trainer's `_compute_loss` seam calls `own_loss` only when `GRPOHubConfig.uses_own_loss`; it passes TRL's
forward (`_get_per_token_logps_and_entropies`) as a callable, the settings as `OwnLossSettings`, the denominator
(`grpo_hub.algos.loss_denominator.micro_batch_denominator`, bound to the step's counts) and the metrics. The surrogate
comes from the loss-type registry (`grpo_hub.algos.loss_types`), the formulas from `grpo_hub.algos.losses`.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo_hub.algos import loss_types, losses
from grpo_hub.algos.surrogates import Bounds, Surrogate
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
    def surrogate(self) -> Surrogate:
        return loss_types.REGISTRY[self.loss_type].surrogate

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.epsilon_low, self.epsilon_high, self.dual_clip_c)

    @property
    def agg_mode(self) -> str:
        return loss_types.own_path_agg_mode(self.loss_type, self.loss_agg_mode)


def own_loss(
    inputs: dict,
    logps_and_entropies: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
    settings: OwnLossSettings,
    denominator: Callable[[str, torch.Tensor], torch.Tensor],
    metrics: dict,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Clipped (or CISPO) surrogate with turn/token/sequence ratio pooling, aggregated by `loss_agg_mode`.

    `logps_and_entropies(input_ids, attention_mask, logits_to_keep)` -> per-token log-probs and entropies of
    the policy; `denominator(kind, count)` -> the micro-batch's denominator (`micro_batch_denominator`) where
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
    per_token_loss = settings.surrogate.loss(ratio, advantages, per_token_logps, settings.bounds)
    if "importance_sampling_ratio" in inputs:
        per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
    per_token_kl = None
    if settings.beta != 0.0:
        per_token_kl = losses.kl_penalty(per_token_logps, inputs["ref_per_token_logps"], kind="k3")
        if settings.use_bias_correction_kl:
            per_token_kl = per_token_kl * ratio
        per_token_loss = per_token_loss + settings.beta * per_token_kl
    loss = aggregate(per_token_loss, mask, settings, denominator)
    log_metrics(ratio, advantages, mask, entropies, per_token_kl, settings, metrics, reduce_sum)
    return loss


def aggregate(per_token_loss, mask, settings: OwnLossSettings, denominator) -> torch.Tensor:
    """`loss_agg_mode` (default: grpo -> seq-mean-token-mean, dapo/cispo -> token-mean) for one micro-batch.

    The mean `aggregate_loss` takes over the micro-batch is turned back into a sum (× the rows or tokens it
    averaged over) and divided by the loss denominator: token-mean by BATCH_TOKENS (the loss tokens of the whole
    generation batch, so it does not depend on how rows fall into micro-batches), seq-mean modes by ROWS.
    """
    agg_mode = settings.agg_mode
    loss = losses.aggregate_loss(per_token_loss, mask, agg_mode, norm_length=settings.max_completion_length)
    if agg_mode in losses.SEQ_MEAN_AGG_MODES:
        rows_averaged = (mask.sum(dim=1) > 0).sum().clamp(min=1)  # aggregate_loss skips empty rows
        return loss * rows_averaged / denominator(loss_types.ROWS, rows_averaged)
    tokens = mask.sum().clamp(min=1.0)
    return loss * tokens / denominator(loss_types.BATCH_TOKENS, tokens)


def log_metrics(ratio, advantages, mask, entropies, per_token_kl, settings, metrics, reduce_sum) -> None:
    """Entropy, KL and the surrogate's clip fractions as token means over all ranks (TRL's metric names)."""

    def global_mean(x):
        x = x.expand_as(mask)
        totals = reduce_sum(torch.stack([(x * mask).sum(), mask.sum().float()]))
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    metrics["entropy"].append(global_mean(entropies))
    if per_token_kl is not None:
        metrics["kl"].append(global_mean(per_token_kl))
    clipped = settings.surrogate.clipped(ratio.detach(), advantages, settings.bounds)
    for name, tokens in clipped.items():
        metrics[name].append(global_mean(tokens.float()))
