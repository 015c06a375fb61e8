"""vLLM's importance-sampling (IS) ratio taken from the training forward, where TRL would run a scoring forward for it.

With vLLM and `vllm_importance_sampling_correction`, TRL 1.16 runs a no-grad forward over every generated row to get
`old_per_token_logps`, even when every row is trained inside the optimizer step that generated it; then those
log-probs equal the training forward's own, detached (huggingface/trl#5412). Where that holds
(`config.vllm_checks.scoring_forward_reason` is None), the scored batch carries no IS ratio and `LossTimeIS.weights`
computes it in the loss from the training forward (`algos.importance.rollout_is_weights`: TRL's formula, or the
geometric mean of `vllm_is_pooling="mean"`). The diagnostics TRL and grpo_hub log at scoring time (`sampling/*`,
`vllm_is/*`) are summed per rank over the batch's micro-batches and logged once per generation batch by `flush`, with
the same aggregation over ranks; they cover the rows trained (not the zero-signal rows that filtering or dynamic
sampling drop, which TRL's path includes).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from transformers import TrainerCallback

from grpo_hub.algos import importance
from grpo_hub.generation.is_diagnostics import MAX_ENTRY, append_is_diagnostics, is_settings, local_is_sums

# Per rank, summed over a generation batch's micro-batches: TRL's sampling metrics (Σ|Δ|, tokens, Σ ratio, ratio
# units), then the geometric-mean weight (Σ, rows) of vllm_is_pooling="mean".
DELTA_SUM, DELTA_COUNT, RATIO_SUM, RATIO_COUNT, GEOMETRIC_SUM, GEOMETRIC_ROWS = range(6)


class LossTimeIS:
    """IS weights of each micro-batch from its training forward; the generation batch's diagnostics, logged once.

    `trl_mode`, `low`, `high`: TRL's `vllm_importance_sampling_mode` and clip bounds; `pooling`: `vllm_is_pooling`;
    `gather` concatenates a tensor of every rank along dim 0; `metrics`: the trainer's train metrics."""

    def __init__(self, *, trl_mode: str, pooling: str | None, low, high, gather, metrics):
        self.settings, self.low, self.high = is_settings(trl_mode, pooling), low, high
        self._gather, self._metrics = gather, metrics
        self._sums = self._extremes = self._is_sums = None  # the generation batch being trained, this rank

    def weights(self, inputs: dict, per_token_logps: torch.Tensor) -> torch.Tensor:
        """The IS weight of `inputs` from the training forward's `per_token_logps` (detached); records diagnostics."""
        mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        trainer, sampler = per_token_logps.detach(), inputs["sampling_per_token_logps"]
        bounds = {"low": self.low, "high": self.high}
        weight = importance.rollout_is_weights(trainer, sampler, mask, **self.settings, **bounds)
        trl_ratio = weight
        if self.settings["pooling"] != "sum":  # TRL's sampling metrics describe its own (product) ratio
            trl_ratio = importance.rollout_is_weights(
                trainer, sampler, mask, **self.settings | {"pooling": "sum"}, **bounds
            )
        self._record(trainer, sampler, mask, trl_ratio, weight)
        return weight

    def _record(self, trainer, sampler, mask, trl_ratio, weight) -> None:
        keep = mask.bool()
        delta = (trainer - sampler).abs()[keep & ~torch.isnan(sampler)]
        flat = trl_ratio.flatten() if self.settings["level"] == "sequence" else trl_ratio[keep]
        sums = torch.tensor(
            [
                delta.sum().item(),
                delta.numel(),
                flat.sum().item(),
                flat.numel(),
                weight.sum().item(),
                weight.shape[0],
            ],
            dtype=torch.float64,
        )
        extremes = torch.tensor(  # max |Δ|, min ratio, max ratio (empty: the identity of the reduction)
            [
                delta.max().item() if delta.numel() else -math.inf,
                flat.min().item() if flat.numel() else math.inf,
                flat.max().item() if flat.numel() else -math.inf,
            ],
            dtype=torch.float64,
        )
        level, pooling = self.settings["level"], self.settings["pooling"]
        is_sums = local_is_sums(
            trainer, sampler, mask, level=level, pooling=pooling, low=self.low, high=self.high
        )
        if self._sums is None:
            self._sums, self._extremes, self._is_sums = sums, extremes, is_sums
            return
        before = self._extremes
        self._sums += sums
        self._extremes = torch.stack(
            [before[0].maximum(extremes[0]), before[1].minimum(extremes[1]), before[2].maximum(extremes[2])]
        )
        self._is_sums = torch.cat(
            [
                self._is_sums[:MAX_ENTRY] + is_sums[:MAX_ENTRY],
                self._is_sums[MAX_ENTRY:].maximum(is_sums[MAX_ENTRY:]),
            ]
        )

    def pending(self) -> torch.Tensor:
        """This rank's sums of the pending generation batch, as `flush` gathers them (one float64 vector)."""
        return torch.cat([self._sums, self._extremes, self._is_sums])

    def flush(self) -> None:
        """Log the trained generation batch's diagnostics (TRL's aggregation over ranks), if any, and start the next.
        A collective: every rank calls it at the same point, and every rank's loss ran on the same micro-steps (pad
        rows included), so all or none have a batch pending."""
        if self._sums is None:
            return
        per_rank = self._gather(self.pending().unsqueeze(0)).cpu()
        self._sums = self._extremes = self._is_sums = None
        append_trl_sampling_metrics(per_rank[:, :6], per_rank[:, 6:9], self._metrics)
        if self.settings["pooling"] == "mean":
            rows = per_rank[:, GEOMETRIC_ROWS].clamp(min=1)
            self._metrics["vllm_is/ratio_geometric_mean"].append(
                (per_rank[:, GEOMETRIC_SUM] / rows).mean().item()
            )
        append_is_diagnostics(per_rank[:, 9:], self._metrics, self.settings["mode"])


def append_trl_sampling_metrics(sums: torch.Tensor, extremes: torch.Tensor, metrics) -> None:
    """TRL 1.16's `sampling/*` metrics from per-rank sums (rows: ranks): each rank's mean (0 when it has no token or
    unit, as TRL), then the mean over ranks; max |Δ| and the ratio's min / max over ranks (an empty rank reports 0)."""

    def rank_mean(total, count):
        return torch.where(count > 0, total / count.clamp(min=1), 0.0)

    def rank_extreme(values, count):
        return torch.where(count > 0, values, 0.0)

    delta_count, ratio_count = sums[:, DELTA_COUNT], sums[:, RATIO_COUNT]
    metrics["sampling/sampling_logp_difference/mean"].append(
        rank_mean(sums[:, DELTA_SUM], delta_count).mean().item()
    )
    metrics["sampling/sampling_logp_difference/max"].append(
        rank_extreme(extremes[:, 0], delta_count).max().item()
    )
    metrics["sampling/importance_sampling_ratio/min"].append(
        rank_extreme(extremes[:, 1], ratio_count).min().item()
    )
    metrics["sampling/importance_sampling_ratio/mean"].append(
        rank_mean(sums[:, RATIO_SUM], ratio_count).mean().item()
    )
    metrics["sampling/importance_sampling_ratio/max"].append(
        rank_extreme(extremes[:, 2], ratio_count).max().item()
    )


@contextmanager
def ratio_from_forward(owner, inputs: dict, loss_time_is: LossTimeIS | None):
    """Within it, `owner._get_per_token_logps_and_entropies` (TRL's forward, which TRL's loss and grpo_hub's own loss
    call once per micro-batch) also puts `loss_time_is.weights(inputs, log_probs)` into
    `inputs["importance_sampling_ratio"]`, which both losses read after that forward. None: nothing changes."""
    if loss_time_is is None:
        yield
        return
    name = "_get_per_token_logps_and_entropies"
    shadowed, forward = vars(owner).get(name), getattr(owner, name)

    def forward_and_weigh(*args, **kwargs):
        out = forward(*args, **kwargs)
        inputs["importance_sampling_ratio"] = loss_time_is.weights(inputs, out[0])
        return out

    setattr(owner, name, forward_and_weigh)
    try:
        yield
    finally:
        if shadowed is None:
            delattr(owner, name)
        else:
            setattr(owner, name, shadowed)


@contextmanager
def scoring_without_ratio(owner, loss_time_is: LossTimeIS | None):
    """Within it, TRL's `_generate_and_score_completions` sees no IS correction: on an aligned, one-iteration batch it
    runs no scoring forward and computes no ratio (`old_per_token_logps` left out, which its loss then takes from the
    training forward). First logs the generation batch trained before (several per optimizer step when
    steps_per_generation < gradient_accumulation_steps). None: nothing changes."""
    if loss_time_is is None:
        yield
        return
    loss_time_is.flush()
    before, owner.vllm_importance_sampling_correction = owner.vllm_importance_sampling_correction, False
    try:
        yield
    finally:
        owner.vllm_importance_sampling_correction = before


class FlushCallback(TrainerCallback):
    """Logs `LossTimeIS`'s pending generation batch at the end of each optimizer step, before transformers logs."""

    def __init__(self, loss_time_is: LossTimeIS):
        self.loss_time_is = loss_time_is

    def on_step_end(self, args, state, control, **kwargs):
        self.loss_time_is.flush()
