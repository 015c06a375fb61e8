"""Rollout-vs-trainer importance sampling (IS) weights and mismatch diagnostics. Pure torch.

The sampler (e.g. vLLM) and the trainer compute slightly different log-probs for the same tokens; the IS
weight exp(log π_trainer - log π_sampler) corrects the policy gradient for that mismatch (Yao et al.,
"Your efficient RL framework secretly brings you off-policy RL training", 2025; TRL
`vllm_importance_sampling_mode`, verl rollout IS). NaN sampler log-probs mark tokens the sampler did not
report.
"""

from __future__ import annotations

import math

import torch

from grpo_hub.algos.losses import kl_penalty

POOLINGS = ("sum", "mean")
LOG_WEIGHT_BOUND = 80.0  # exp(80) ~ 5.5e34: finite in float32 (max ~3.4e38)


def rollout_is_weights(
    trainer_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    pooling: str = "sum",
    mode: str = "truncate",
    low: float | None = None,
    high: float | None = 2.0,
) -> torch.Tensor:
    """Detached IS weights: (B, T) at token level, (B, 1) at sequence level.

    d_t = log π_trainer(t) - log π_sampler(t) on masked-in tokens whose sampler log-prob is not NaN,
    d_t = 0 elsewhere (a missing token, NaN in either input, has ratio 1 and is excluded from the pool).
    token:    w_t = exp(d_t)
    sequence: w = exp(Σ_t d_t)         pooling="sum": product of token ratios (TRL 1.16, verl)
              w = exp(Σ_t d_t / n)     pooling="mean": geometric mean over the n pooled tokens (trl#5814;
                                       GSPO-style length normalisation); n = 0 gives w = 1.
    mode="truncate": w = clamp(w, low, high) (truncated IS, TIS);
    mode="mask":     w = 0 where w < low or w > high, else unchanged (masked IS, MIS).
    A bound set to None is absent (no lower bound when low is None, in both modes, as TRL).
    With pooling="sum" this reproduces TRL's token_truncate / token_mask / sequence_truncate /
    sequence_mask exactly (clip_min=low, clip_max=high). The log weight is clamped to ±80 before exp so
    weights stay finite (TRL would give inf for an unbounded truncate above that).
    """
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if mode not in ("truncate", "mask"):
        raise ValueError(f"mode must be 'truncate' or 'mask', got {mode!r}")
    keep = mask.bool() & ~torch.isnan(sampler_logp) & ~torch.isnan(trainer_logp)
    log_weight = torch.where(keep, trainer_logp - sampler_logp, 0.0).detach()
    if level == "sequence":
        log_weight = log_weight.sum(-1, keepdim=True)
        if pooling == "mean":
            log_weight = log_weight / keep.sum(-1, keepdim=True).clamp(min=1)
    weight = torch.exp(log_weight.clamp(-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND))
    if mode == "truncate":
        return weight if low is None and high is None else weight.clamp(min=low, max=high)
    lower = -math.inf if low is None else low
    upper = math.inf if high is None else high
    return weight.masked_fill((weight < lower) | (weight > upper), 0.0)


def mismatch_stats(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> dict:
    """Sampler-vs-trainer mismatch over masked-in tokens where both log-probs are finite (python floats).

    abs_diff_mean / abs_diff_max: mean / max of |log π_trainer - log π_sampler| (TRL's
    sampling/sampling_logp_difference metrics). kl_k1 / kl_k3: KL(π_sampler || π_trainer) estimated on
    the sampler's tokens with Schulman's k1 = log π_s - log π_t and k3 = r - 1 - log r, r = π_t / π_s
    (`losses.kl_penalty` with the sampler as the policy). tokens: count used.
    No usable token gives zeros, never NaN.
    """
    keep = mask.bool() & torch.isfinite(sampler_logp) & torch.isfinite(trainer_logp)
    trainer = trainer_logp.detach()[keep].double()
    sampler = sampler_logp.detach()[keep].double()
    if trainer.numel() == 0:
        return {"abs_diff_mean": 0.0, "abs_diff_max": 0.0, "kl_k1": 0.0, "kl_k3": 0.0, "tokens": 0.0}
    abs_diff = (trainer - sampler).abs()
    return {
        "abs_diff_mean": abs_diff.mean().item(),
        "abs_diff_max": abs_diff.max().item(),
        "kl_k1": kl_penalty(sampler, trainer, "k1").mean().item(),
        "kl_k3": kl_penalty(sampler, trainer, "k3").mean().item(),
        "tokens": float(trainer.numel()),
    }


def effective_sample_size(weights: torch.Tensor) -> float:
    """Kish's normalised effective sample size of importance weights, (Σw)² / (n Σw²), in (0, 1]: 1 when every
    weight is equal, 1 / n when one carries all the mass (Kish, "Survey Sampling", 1965; the ESS diagnostic of
    verl's rollout IS). No weight, or all zero, gives 1.0 (nothing is reweighted)."""
    w = weights.detach().double().flatten()
    return ess_from_sums(w.sum().item(), (w * w).sum().item(), w.numel())


def ess_from_sums(weight_sum: float, square_sum: float, count: float) -> float:
    """`effective_sample_size` from Σw, Σw² and n, which add up over micro-batches and ranks."""
    return 1.0 if square_sum == 0.0 else weight_sum**2 / (count * square_sum)
