"""vLLM importance sampling on the scored batch: the geometric-mean sequence weight of `vllm_is_pooling="mean"`
(`edit_is_weights`), and diagnostics (logged every generation step while the correction is on, over all ranks):
  vllm_is/abs_logp_diff_mean, vllm_is/abs_logp_diff_max  |log π_trainer - log π_sampler| per token
  vllm_is/kl_k1, vllm_is/kl_k3                            KL(π_sampler || π_trainer) estimates per token
  vllm_is/frac_truncated or vllm_is/frac_masked           fraction of IS units (tokens, or sequences at
                                                          sequence level) whose raw weight lies outside
                                                          [clip_min, clip_max], i.e. that the mode clamps or zeroes
  vllm_is/ess                                             Kish's normalised effective sample size of the raw
                                                          weights over the IS units (`importance.
                                                          effective_sample_size`): 1 = no reweighting
"""

from __future__ import annotations

import torch

from grpo_hub.algos import importance

MAX_ENTRY = -1  # `local_is_sums`: the one entry that reduces by max (max |Δ|)


def is_settings(trl_mode: str, pooling: str | None) -> dict:
    """level / pooling / mode of `importance.rollout_is_weights` for TRL's `vllm_importance_sampling_mode`."""
    return {
        "level": "sequence" if trl_mode.startswith("sequence_") else "token",
        "pooling": pooling or "sum",
        "mode": "truncate" if trl_mode.endswith("truncate") else "mask",
    }


def geometric_is_ratio(output: dict, mode: str, low: float, high: float) -> torch.Tensor:
    """Sequence IS weight from the geometric mean of token ratios (TRL uses their product); `mode` is TRL's
    `vllm_importance_sampling_mode`."""
    mask = output["completion_mask"] * output.get("tool_mask", 1)
    return importance.rollout_is_weights(  # a NaN sampler logprob: ratio 1, left out of the mean
        output["old_per_token_logps"],
        output["sampling_per_token_logps"],
        mask,
        **is_settings(mode, "mean"),  # a sequence_* mode (config check): sequence level, geometric mean
        low=low,
        high=high,
    )


def edit_is_weights(output: dict, metrics, gather, *, trl_mode: str, pooling: str | None, low, high) -> None:
    """vLLM IS of one scored batch: with `vllm_is_pooling="mean"` TRL's sequence weight (the product of token
    ratios) is replaced by their geometric mean (logged as vllm_is/ratio_geometric_mean); then the diagnostics."""
    if pooling == "mean" and "importance_sampling_ratio" in output:
        output["importance_sampling_ratio"] = geometric_is_ratio(output, trl_mode, low, high)
        metrics["vllm_is/ratio_geometric_mean"].append(
            gather(output["importance_sampling_ratio"].float().mean().reshape(1)).mean().item()
        )
    log_is_diagnostics(output, metrics, gather, settings=is_settings(trl_mode, pooling), low=low, high=high)


def local_is_sums(trainer_logp, sampler_logp, mask, *, level, pooling, low, high) -> torch.Tensor:
    """This rank's [Σ|Δ|, Σk1, Σk3, tokens, IS units, units outside [low, high], Σw, Σw², max|Δ|] (float64; w: the
    raw weight of each IS unit). Every entry but the last (`MAX_ENTRY`) adds up over micro-batches and ranks."""
    stats = importance.mismatch_stats(trainer_logp, sampler_logp, mask)
    raw = importance.rollout_is_weights(
        trainer_logp, sampler_logp, mask, level=level, pooling=pooling, mode="truncate", low=None, high=None
    )
    units = mask.bool() if level == "token" else mask.bool().any(dim=-1, keepdim=True)
    outside = torch.zeros_like(units)
    if low is not None:
        outside |= raw < low
    if high is not None:
        outside |= raw > high
    tokens, unit_weights = stats["tokens"], raw[units].double()
    return torch.tensor(
        [
            stats["abs_diff_mean"] * tokens,
            stats["kl_k1"] * tokens,
            stats["kl_k3"] * tokens,
            tokens,
            float(units.sum()),
            float((outside & units).sum()),
            unit_weights.sum().item(),
            unit_weights.square().sum().item(),
            stats["abs_diff_max"],
        ],
        dtype=torch.float64,
    )


def log_is_diagnostics(output: dict, metrics, gather, *, settings: dict, low, high) -> None:
    """Append the mismatch diagnostics of this generation batch (all ranks, via `gather`) to `metrics`."""
    trainer_logp = output.get("old_per_token_logps")
    sampler_logp = output.get("sampling_per_token_logps")
    if trainer_logp is None or sampler_logp is None:
        return
    mask = output["completion_mask"] * output.get("tool_mask", 1)
    sums = local_is_sums(
        trainer_logp,
        sampler_logp,
        mask,
        level=settings["level"],
        pooling=settings["pooling"],
        low=low,
        high=high,
    )
    append_is_diagnostics(gather(sums.unsqueeze(0)).cpu(), metrics, settings["mode"])


def append_is_diagnostics(per_rank: torch.Tensor, metrics, mode: str) -> None:
    """Append the vllm_is/* metrics of one generation batch from every rank's `local_is_sums` (rows: ranks); `mode`:
    "truncate" or "mask"."""
    total, global_max = per_rank.sum(dim=0), per_rank[:, MAX_ENTRY].max().item()
    tokens, units = max(total[3].item(), 1.0), max(total[4].item(), 1.0)
    metrics["vllm_is/abs_logp_diff_mean"].append(total[0].item() / tokens)
    metrics["vllm_is/abs_logp_diff_max"].append(global_max)
    metrics["vllm_is/kl_k1"].append(total[1].item() / tokens)
    metrics["vllm_is/kl_k3"].append(total[2].item() / tokens)
    outside_key = "vllm_is/frac_truncated" if mode == "truncate" else "vllm_is/frac_masked"
    metrics[outside_key].append(total[5].item() / units)
    metrics["vllm_is/ess"].append(importance.ess_from_sums(total[6].item(), total[7].item(), units))
