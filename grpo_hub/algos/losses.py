"""Policy-loss building blocks for GRPO-family training. Pure torch: imports neither trl nor transformers.

Shapes: per-token tensors are (B, T) with a (B, T) bool/0-1 `mask` of completion tokens; advantages are
(B, 1) or (B, T) and broadcast. Every function returns per-token values except `aggregate_loss`.
"""

from __future__ import annotations

import torch

LEVELS = ("token", "sequence", "turn")
SEQ_MEAN_AGG_MODES = (
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)  # means over rows
AGG_MODES = ("token-mean", *SEQ_MEAN_AGG_MODES)
KL_BOUND = 20.0


def pool_log_ratio(
    log_ratio: torch.Tensor, mask: torch.Tensor, level: str = "token", turn_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token (B, T) log importance ratio pooled at token, sequence or turn level.

    token:    log r_t unchanged.
    sequence: log s = Σ_t m_t log r_t / max(Σ_t m_t, 1) on every token of the row (GSPO's geometric-mean
              ratio, arXiv:2507.18071; identical to TRL 1.16 importance_sampling_level="sequence", whose
              (B, 1) result broadcasts the same way; an all-masked row gets 0).
    turn:     the same masked mean over each (row, turn id) unit, `turn_ids` (B, T) integers; masked
              positions are ignored and get 0.
    Masked positions never influence valid ones (they are replaced, not multiplied, so NaN/inf there is
    harmless).
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if level == "token":
        return log_ratio
    keep = mask.bool()
    masked = torch.where(keep, log_ratio, 0.0)
    if level == "sequence":
        pooled = masked.sum(-1, keepdim=True) / keep.sum(-1, keepdim=True).clamp(min=1)
        return pooled.expand_as(log_ratio)
    if turn_ids is None:
        raise ValueError("level='turn' needs turn_ids (B, T)")
    rows = torch.arange(log_ratio.shape[0], device=log_ratio.device)[:, None].expand_as(turn_ids)
    units = torch.stack([rows, turn_ids], dim=-1).reshape(-1, 2)
    _, unit_index = torch.unique(units, dim=0, return_inverse=True)
    n_units = int(unit_index.max()) + 1
    sums = masked.new_zeros(n_units).index_add(0, unit_index, masked.reshape(-1))
    counts = masked.new_zeros(n_units).index_add(0, unit_index, keep.reshape(-1).to(masked.dtype))
    pooled = (sums / counts.clamp(min=1))[unit_index].reshape(log_ratio.shape)
    return torch.where(keep, pooled, 0.0)


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> torch.Tensor:
    """Per-token PPO clipped surrogate loss (PPO arXiv:1707.06347; asymmetric ε from DAPO arXiv:2503.14476).

    L = -min(r·A, clip(r, 1 - ε_low, 1 + ε_high)·A)
    dual_clip = c > 1 (dual-clip PPO, arXiv:1912.09729): where A < 0, L = min(L, -c·A), i.e. the loss of
    a negative-advantage token is capped at c·|A| however large r grows. verl: clip_ratio_c = 3.0;
    ROLL dual_clip_loss: c = 1 + 2·pg_clip.
    TRL's `delta` (clamp r at δ before the min) gives exactly this loss with c = δ whenever
    δ > 1 + ε_high: for A < 0 both equal min(max(r, clip(r)), δ)·|A|, for A >= 0 both are the plain clip.
    """
    loss = -torch.min(ratio * advantages, ratio.clamp(1 - eps_low, 1 + eps_high) * advantages)
    if dual_clip is None:
        return loss
    if dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    return torch.where(advantages < 0, torch.minimum(loss, -dual_clip * advantages), loss)


def cispo_loss(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    logp: torch.Tensor,
    low: float | None = None,
    high: float | None = 5.0,
) -> torch.Tensor:
    """Per-token CISPO loss (MiniMax-M1, arXiv:2506.13585): L = -sg(clamp(r, low, high)) · A · log π(t).

    `low`/`high` are ABSOLUTE ratio bounds (None = unbounded). TRL 1.16 loss_type="cispo" is
    low=None, high=epsilon_high (TRL clamps max=epsilon_high; ScaleRL recommends 5.0, and epsilon_high
    defaults to epsilon=0.2 in TRL, which caps every ratio at 0.2). verl/ROLL-style relative ranges
    1 - ε_low, 1 + ε_high map to low = 1 - ε_low, high = 1 + ε_high. The gradient flows through log π only.
    """
    bounded = ratio if low is None and high is None else ratio.clamp(min=low, max=high)
    return -bounded.detach() * advantages * logp


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(π || π_ref) estimators from tokens sampled by π (Schulman, "Approximating KL", 2020).

    d = ref_logp - logp;  k1 = -d;  k2 = d² / 2;  k3 = exp(d) - d - 1 (>= 0, unbiased, low variance).
    k3 equals TRL 1.16's per_token_kl. For k3, d is clamped to ±KL_BOUND = ±20 first (as verl
    `kl_penalty`), so extreme log-probs give a finite value (gradient 0 beyond the bound); verl also
    clamps the k3 value to [-10, 10], which is not done here.
    """
    diff = ref_logp - logp
    if kind == "k1":
        return -diff
    if kind == "k2":
        return 0.5 * diff**2
    if kind == "k3":
        diff = diff.clamp(-KL_BOUND, KL_BOUND)
        return torch.exp(diff) - diff - 1
    raise ValueError(f"kind must be one of ('k1', 'k2', 'k3'), got {kind!r}")


def aggregate_loss(
    loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", *, norm_length: int | None = None
) -> torch.Tensor:
    """Scalar loss from per-token losses, verl `agg_loss` (core_algos.py) / ROLL `agg_loss` semantics.

    token-mean:              Σ_bt m·l / Σ_bt m                         (DAPO; TRL "bnpo", "dapo" on 1 rank)
    seq-mean-token-sum:      mean over rows of Σ_t m·l
    seq-mean-token-mean:     mean over rows of Σ_t m·l / Σ_t m         (GRPO; TRL "grpo")
    seq-mean-token-sum-norm: Σ_bt m·l / rows / norm_length             (Dr. GRPO; TRL "dr_grpo" with
                             norm_length = max_completion_length; default norm_length = T)
    "rows" counts only rows with at least one masked-in token: fully masked rows are excluded from the
    sequence mean, as in recent verl (seq_mask = token count > 0). TRL's grpo/dr_grpo divide by all B
    rows instead, so they agree exactly when no row is fully masked. Masked positions never contribute
    (values there are replaced, so NaN/inf is harmless); an all-masked batch gives 0.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"mode must be one of {AGG_MODES}, got {mode!r}")
    keep = mask.bool()
    masked = torch.where(keep, loss, 0.0)
    tokens = keep.sum(-1)
    if mode == "token-mean":
        return masked.sum() / tokens.sum().clamp(min=1)
    rows = (tokens > 0).sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / tokens.clamp(min=1)).sum() / rows
    total = masked.sum() / rows
    if mode == "seq-mean-token-sum-norm":
        return total / (norm_length if norm_length is not None else keep.shape[-1])
    return total
