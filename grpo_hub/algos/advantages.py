"""Advantage estimators for GRPO-family training. Pure torch: imports neither trl nor transformers.

Layout convention (TRL's): `group_size` consecutive rows are the completions of one prompt, so a batch of
N rows holds N / group_size groups. Ragged groups (per-prompt rollout budgets, `algos.rollout_budget`): where a
function takes `group_size`, a sequence of group sizes instead (consecutive groups of those many rows, summing to
N) is read as those groups, NaN-padded to the largest, so every statistic runs over each group's own rows; sizes
that are all equal are exactly the int case. NaN rewards mark unscorable completions: they are left out of every
statistic and receive advantage 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

GroupSize = int | Sequence[int]  # one size for every group, or each group's own (ragged groups)

NORMS = ("mean_std", "mean_only", "no_baseline")
STD_SCOPES = ("group", "batch")
REWARD_NORMS = ("batch", "running")
PROCESS_VARIANTS = ("outcome", "process", "process_rtg")
TURN_SCOPES = ("turn", "group")
INFORMATIVE, ALL_MAX, ALL_MIN = 0, 1, 2  # zero_signal_kinds
KIND_NAMES = {ALL_MAX: "all_max", ALL_MIN: "all_min"}


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _sizes(n: int, group_size: GroupSize) -> list[int] | None:
    """The ragged group sizes of `group_size` over `n` rows; None when every group has the same size."""
    if isinstance(group_size, int):
        if group_size < 1 or n % group_size:
            raise ValueError(f"{n} rows cannot be split into groups of group_size={group_size}")
        return None
    sizes = [int(size) for size in group_size]
    if sum(sizes) != n or min(sizes, default=1) < 1:
        raise ValueError(f"{n} rows cannot be split into groups of sizes {sizes}")
    return None if len(set(sizes)) <= 1 else sizes


def _grouped(x: torch.Tensor, group_size: GroupSize) -> torch.Tensor:
    """Reshape (N, ...) into (groups, largest group, ...); ragged groups are padded with NaN."""
    sizes = _sizes(x.shape[0], group_size)
    if sizes is None:
        size = group_size if isinstance(group_size, int) else (list(group_size) or [1])[0]
        return x.reshape(-1, size, *x.shape[1:])
    grid = x.new_full((len(sizes), max(sizes), *x.shape[1:]), math.nan)
    grid[_ragged_mask(sizes, x.device)] = x
    return grid


def _ragged_mask(sizes: list[int], device=None) -> torch.Tensor:
    """(groups, largest group) bool: True at the positions of real rows."""
    return torch.arange(max(sizes), device=device) < torch.tensor(sizes, device=device).unsqueeze(1)


def _rows(grid: torch.Tensor, group_size: GroupSize, n: int) -> torch.Tensor:
    """The inverse of `_grouped`: (N, ...) from (groups, largest group, ...)."""
    sizes = _sizes(n, group_size)
    if sizes is None:
        return grid.reshape(n, *grid.shape[2:])
    return grid[_ragged_mask(sizes, grid.device)]


def per_row(per_group: torch.Tensor, group_size: GroupSize) -> torch.Tensor:
    """Each group's value repeated over its rows: (groups,) -> (N,)."""
    if isinstance(group_size, int):
        return per_group.repeat_interleave(group_size)
    return per_group.repeat_interleave(torch.tensor(list(group_size), device=per_group.device))


def nan_std(x: torch.Tensor, dim) -> torch.Tensor:
    """Unbiased standard deviation over `dim` ignoring NaN, kept dims; NaN where fewer than 2 values.

    Formula (TRL `trl.trainer.utils.nanstd`, reproduced operation by operation so that results match it
    bit for bit): var = nanmean((x - nanmean(x))^2) · n / (n - 1), std = sqrt(var).
    """
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True).to(variance.dtype)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    return torch.sqrt(variance * correction)


def _centre_and_scale(grouped: torch.Tensor, dims, norm: str, eps: float, std_over=None) -> torch.Tensor:
    """(x - nanmean over dims) / (nan_std + eps) per `norm`; NaN results (excluded values, undefined std) -> 0.

    `std_over`: tensor whose global std replaces the per-group one (batch scope); None = per group.
    """
    if norm == "no_baseline":
        return torch.nan_to_num(grouped, nan=0.0)
    centred = grouped - torch.nanmean(grouped, dim=dims, keepdim=True)
    if norm == "mean_std":
        std = nan_std(grouped, dims) if std_over is None else nan_std(std_over.reshape(-1), 0)
        centred = centred / (std + eps)
    return torch.nan_to_num(centred, nan=0.0)


def group_advantages(
    rewards: torch.Tensor,
    group_size: GroupSize,
    *,
    norm: str = "mean_std",
    std_scope: str = "group",
    eps: float = 1e-4,
) -> torch.Tensor:
    """Group-relative advantages (GRPO, DeepSeekMath arXiv:2402.03300 §4.1.2), shape (N,).

    mean_std:  A_i = (r_i - mean_g) / (std + eps)      std = unbiased sample std (torch.std / TRL / verl)
    mean_only: A_i = r_i - mean_g                       (Dr. GRPO, arXiv:2503.20783)
    no_baseline: A_i = r_i
    The baseline mean_g is always the group mean. std_scope="group" takes the std of the group,
    std_scope="batch" the std of every non-NaN reward in the batch (the baseline stays the group mean).
    These reproduce TRL 1.16 `_generate_and_score_completions` (sum_then_normalize): mean_std+group ==
    scale_rewards="group", mean_std+batch == scale_rewards="batch" (group-mean baseline, global nanstd),
    mean_only == scale_rewards="none"; eps=1e-4 is TRL's constant (verl uses 1e-6).
    NaN rewards are excluded from means and stds and get A = 0. A group whose std is undefined (fewer
    than 2 non-NaN rewards, e.g. group_size 1) gets A = 0, as in TRL; verl instead uses mean 0, std 1 for
    singleton groups (A = r / (1 + eps)).
    float32 caveat: a group of equal rewards can give |A| > 0 (rewards near 100 give ~0.1), because the
    mean is not exactly representable; use `zero_signal_mask` to detect such groups, never A == 0.
    """
    _check_choice("norm", norm, NORMS)
    _check_choice("std_scope", std_scope, STD_SCOPES)
    grouped = _grouped(rewards, group_size)
    std_over = rewards if std_scope == "batch" else None
    return _rows(_centre_and_scale(grouped, 1, norm, eps, std_over), group_size, rewards.shape[0])


def zero_signal_mask(rewards: torch.Tensor, group_size: GroupSize, eps: float = 0.0) -> torch.Tensor:
    """Bool (N,): True for rows whose group carries no learning signal.

    A group has zero signal when max(r) - min(r) <= eps over its non-NaN rewards, or when it has fewer
    than 2 non-NaN rewards. Decided from the rewards, never from advantage == 0 (see the float32
    caveat in `group_advantages`). DAPO's dynamic sampling (arXiv:2503.14476) drops exactly these groups.
    """
    grouped = _grouped(rewards, group_size)
    valid = ~torch.isnan(grouped)
    high = torch.where(valid, grouped, -math.inf).amax(dim=1)
    low = torch.where(valid, grouped, math.inf).amin(dim=1)
    zero = (valid.sum(dim=1) < 2) | (high - low <= eps)
    return per_row(zero, group_size)


def zero_signal_kinds(
    rewards: torch.Tensor, group_size: GroupSize, eps: float, low: float, high: float
) -> torch.Tensor:
    """(groups,) long: INFORMATIVE, ALL_MAX or ALL_MIN per group of `group_size` consecutive rows.

    A group is zero-signal as in `zero_signal_mask` (reward spread max - min <= eps over its non-NaN
    rewards, or fewer than 2 of them). Its flat value v (mean of its non-NaN rewards) is ALL_MAX when it lies
    in the upper half of [low, high] (v - low >= high - v: every completion solved the prompt), else ALL_MIN
    (none did). A group without any non-NaN reward carries no evidence and is INFORMATIVE. DAPO
    (arXiv:2503.14476) reports these as the prompts with accuracy 1 and accuracy 0; GRESO (arXiv:2506.02177)
    skips them with different probabilities. Both carry no GRPO gradient.
    """
    grouped = _grouped(rewards.double(), group_size)
    zero = _grouped(zero_signal_mask(rewards, group_size, eps).double(), group_size)[:, 0].bool()
    value = torch.nanmean(grouped, dim=1)
    kinds = torch.where((value - low) >= (high - value), ALL_MAX, ALL_MIN)
    return torch.where(zero & ~torch.isnan(value), kinds, INFORMATIVE)


def whiten(
    values: torch.Tensor, mask: torch.Tensor | None = None, *, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Masked whitening over ALL masked-in entries of the tensor (one global mean and variance).

    w = (x - mean) · rsqrt(var + eps), var unbiased; if not shift_mean the mean is added back:
    w + mean. Source: verl `verl_F.masked_whiten` / TRL PPO `masked_whiten` / ROLL `masked_whiten`.
    Masked-out entries are returned unchanged. With a single masked-in entry var := 0 (verl raises),
    so that entry becomes 0 (or its own value when shift_mean=False).
    """
    keep = torch.ones_like(values, dtype=torch.bool) if mask is None else mask.bool()
    count = keep.sum()
    mean = torch.where(keep, values, 0.0).sum() / count.clamp(min=1)
    var = (torch.where(keep, values - mean, 0.0) ** 2).sum() / (count - 1).clamp(min=1)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(keep, whitened, values)


def clip_advantages(advantages: torch.Tensor, clip_range: float) -> torch.Tensor:
    """Symmetric clamp to [-clip_range, clip_range] (ROLL `advantage_clip`, applied after whitening)."""
    if clip_range <= 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    return advantages.clamp(-clip_range, clip_range)


@dataclass
class RunningMoments:
    """Running count / mean / M2 (sum of squared deviations) of a reward stream, in float64.

    Each batch is reduced to its own (n, mean, M2) and merged with Chan, Golub & LeVeque's parallel
    formula: delta = mean_b - mean, mean += delta·n_b/n, M2 += M2_b + delta²·n_a·n_b/n. ROLL's
    `RunningMoments` (roll/utils/functionals.py) does the same update with a variance instead of M2.
    """

    count: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def merge(self, other: RunningMoments) -> None:
        total = self.count + other.count
        if other.count == 0:
            return
        delta = other.mean - self.mean
        self.mean += delta * other.count / total
        self.m2 += other.m2 + delta**2 * self.count * other.count / total
        self.count = total

    def update(self, values: torch.Tensor) -> None:
        """Fold the non-NaN entries of `values` into the moments (in place)."""
        x = values.detach().reshape(-1).double()
        x = x[~torch.isnan(x)]
        if x.numel():
            self.merge(RunningMoments(float(x.numel()), x.mean().item(), ((x - x.mean()) ** 2).sum().item()))

    @property
    def std(self) -> float:
        """Unbiased std sqrt(M2 / (n - 1)); 1.0 (no scaling) while fewer than 2 values were seen."""
        return math.sqrt(self.m2 / (self.count - 1)) if self.count >= 2 else 1.0


def transform_rewards(
    rewards: torch.Tensor,
    *,
    clip: float | None = None,
    norm: str | None = None,
    shift_only: bool = False,
    scale_only: bool = False,
    state: RunningMoments | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """ROLL's reward post-processing (roll/utils/functionals.py `reward_postprocess`): normalise, then clip.

    norm="batch":   r' = (r - mean) / (std + eps) over the batch's non-NaN rewards (ROLL batch_reward_norm)
    norm="running": `state` (a RunningMoments) is first updated in place with this batch, then
                    r' = (r - state.mean) / (state.std + eps) (ROLL reward_norm="running")
    shift_only (ROLL reward_shift): r' = r - mean; scale_only (ROLL reward_scale): r' = r / (std + eps).
    clip (ROLL reward_clip): r'' = clamp(r', -clip, clip), applied AFTER normalisation as ROLL does.
    std is the unbiased std; with fewer than 2 values it is taken as 1 (no scaling). NaN rewards pass
    through as NaN and are excluded from the statistics. ROLL adds eps=1e-6 (batch) and float eps
    (running); here one `eps` serves both.
    """
    if shift_only and scale_only:
        raise ValueError("shift_only and scale_only are exclusive (both = full normalisation: set neither)")
    if norm is None and (shift_only or scale_only):
        raise ValueError("shift_only / scale_only need norm='batch' or norm='running'")
    out = rewards
    if norm is not None:
        _check_choice("norm", norm, REWARD_NORMS)
        if norm == "running":
            if state is None:
                raise ValueError("norm='running' needs a RunningMoments passed as state=")
            state.update(rewards)
            mean, std = state.mean, state.std
        else:
            flat = rewards.reshape(-1)
            mean = torch.nan_to_num(torch.nanmean(flat), nan=0.0)
            std = torch.nan_to_num(nan_std(flat, 0).reshape(()), nan=1.0)
        if shift_only:
            out = out - mean
        elif scale_only:
            out = out / (std + eps)
        else:
            out = (out - mean) / (std + eps)
    if clip is not None:
        out = out.clamp(-clip, clip)
    return out


def discounted_return_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = Σ_{t' >= t} γ^(t'-t) r_t' per row over masked-in steps, shape (B, T); 0 at masked steps.

    Discounting follows the column index (a masked gap still counts as a step). REINFORCE return
    (ROLL `compute_reinforce_return`).
    """
    keep = mask.bool()
    r = torch.where(keep, rewards, 0.0)
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):
        running = r[:, t] + gamma * running
        out[:, t] = running
    return torch.where(keep, out, 0.0)


def _normalise_steps(values: torch.Tensor, mask: torch.Tensor, group_size: int, norm: str, eps: float):
    """Normalise (N, T) step values by the mean/std over ALL masked-in steps of each group; 0 where masked."""
    keep = mask.bool()
    grouped = _grouped(torch.where(keep, values, math.nan), group_size)
    return torch.where(keep, _centre_and_scale(grouped, (1, 2), norm, eps).reshape(values.shape), 0.0)


def process_advantages(
    step_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    *,
    variant: str = "outcome",
    gamma: float = 1.0,
    norm: str = "mean_std",
    eps: float = 1e-4,
) -> torch.Tensor:
    """Per-step advantages (G·n, T) from per-step rewards (G·n, T) padded with `mask`; 0 where masked.

    outcome:     R_i = Σ_t γ^t r_i,t; A_i,t = group_advantages(R)_i on every step (GRPO outcome
                 supervision). Rows with no valid step are treated as NaN rewards (A = 0).
    process:     DeepSeekMath process supervision (arXiv:2402.03300 §4.1.3): r̃ = (r - mean) / (std + eps)
                 over ALL valid steps of the group, then A_t = Σ_{t'>=t} γ^(t'-t) r̃_t'. Constant per-step
                 rewards (CartPole's +1) normalise to 0 and give all-zero advantages: no signal.
    process_rtg: return-to-go first, G_t = Σ_{t'>=t} γ^(t'-t) r_t', then G normalised over the group's
                 valid steps (the fix proposed for GRPO in SB3-contrib for constant per-step rewards:
                 long episodes have larger early returns, so they get positive advantages).
    `norm` as in `group_advantages`; groups with fewer than 2 valid steps have undefined std -> A = 0.
    """
    _check_choice("variant", variant, PROCESS_VARIANTS)
    _check_choice("norm", norm, NORMS)
    keep = mask.bool()
    if variant == "outcome":
        discounts = gamma ** torch.arange(keep.shape[1], dtype=step_rewards.dtype)
        totals = (torch.where(keep, step_rewards, 0.0) * discounts).sum(dim=1)
        returns = torch.where(keep.any(dim=1), totals, math.nan)
        adv = group_advantages(returns, group_size, norm=norm, eps=eps)
        return torch.where(keep, adv[:, None], 0.0)
    if variant == "process":
        normalised = _normalise_steps(step_rewards, keep, group_size, norm, eps)
        return discounted_return_to_go(normalised, keep, gamma)
    returns_to_go = discounted_return_to_go(step_rewards, keep, gamma)
    return _normalise_steps(returns_to_go, keep, group_size, norm, eps)


def turn_group_advantages(
    turn_rewards: torch.Tensor,
    turn_mask: torch.Tensor,
    group_size: int,
    *,
    scope: str = "turn",
    norm: str = "mean_std",
    eps: float = 1e-4,
) -> torch.Tensor:
    """Per-turn group-relative advantages (N, K) from per-turn rewards (N, K); 0 where turn_mask is False.

    scope="turn":  turn k of row i is normalised against turn k of the other rows of its group that have a
                   turn k: A_i,k = (r_i,k - mean_j r_j,k) / (std_j r_j,k + eps) (turn-level credit
                   assignment of MT-GRPO, Zeng et al. 2025, arXiv:2505.11821: the group baseline is taken
                   per turn position). A turn present in fewer than 2 rows of its group gets A = 0.
    scope="group": every valid turn of the group shares one mean/std (DeepSeekMath process statistics).
    `norm` as in `group_advantages`.
    """
    _check_choice("scope", scope, TURN_SCOPES)
    _check_choice("norm", norm, NORMS)
    if scope == "group":
        return _normalise_steps(turn_rewards, turn_mask, group_size, norm, eps)
    keep = turn_mask.bool()
    grouped = _grouped(torch.where(keep, turn_rewards, math.nan), group_size)
    return torch.where(keep, _centre_and_scale(grouped, 1, norm, eps).reshape(turn_rewards.shape), 0.0)
