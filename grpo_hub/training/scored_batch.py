"""Edits and logs of TRL's scored generation batch (the output of `_generate_and_score_completions`).

Called from the trainer's `_calculate_rewards` (reward clip / norm) and `_score_round` with narrow inputs
(tensors, settings, callables, the metrics dict): advantage recomputation (adv_norm, whitening, clipping, KL in
the reward), the advantage logs, the zero-signal kinds, and zero-signal row dropping: `drop_micro_batch_rows` after
TRL's shuffle and split (filtering), `drop_rows` before it (dynamic sampling's group selection). The formulas live in
`grpo_hub.algos`.
"""

import copy
from collections.abc import Callable

import torch

from grpo_hub.algos import advantages as adv_fns
from grpo_hub.algos import losses
from grpo_hub.algos.filtering import agreed_row_count, keep_rows, micro_step_row_counts
from grpo_hub.training.input_checks import check_advantages_finite


class RewardTransform:
    """reward_clip / reward_norm of each reward function's column (`algos.advantages.transform_rewards`, ROLL), with
    the running moments of `reward_norm="running"` kept over training (an eval batch never updates them)."""

    def __init__(self, args, num_funcs: int):
        self.settings = {
            "clip": args.reward_clip,
            "norm": args.reward_norm,
            "shift_only": args.reward_shift,
            "scale_only": args.reward_scale,
        }
        self.active = args.reward_clip is not None or args.reward_norm is not None
        self.moments = [adv_fns.RunningMoments() for _ in range(num_funcs)]

    def __call__(self, rewards_per_func: torch.Tensor, training: bool) -> torch.Tensor:
        columns = [
            adv_fns.transform_rewards(
                rewards_per_func[:, i], state=moments if training else copy.deepcopy(moments), **self.settings
            )
            for i, moments in enumerate(self.moments)
        ]
        return torch.stack(columns, dim=1)


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """TRL's scalar reward: weighted nansum of the reward functions, NaN where none scored the row."""
    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    return rewards.masked_fill(torch.isnan(rewards_per_func).all(dim=1), torch.nan)


def recompute_advantages(
    rewards: torch.Tensor, group_size: int, args, scale_rewards: str, sequence_kl: torch.Tensor | None = None
) -> torch.Tensor:
    """Advantages of all ranks' rows from the (transformed) rewards, with the `adv_norm`, `whiten_advantages`,
    `adv_clip_range` fields of `args`; minus `token_level_kl_coef` · `sequence_kl` when given (verl's
    use_kl_in_reward). `adv_norm` None follows TRL's `scale_rewards` ('none': mean only)."""
    if sequence_kl is not None:
        rewards = rewards - args.token_level_kl_coef * sequence_kl
    norm = args.adv_norm or ("mean_only" if scale_rewards == "none" else "mean_std")
    scope = "batch" if scale_rewards == "batch" else "group"
    advantages = adv_fns.group_advantages(rewards, group_size, norm=norm, std_scope=scope)
    if args.whiten_advantages:
        advantages = adv_fns.whiten(advantages, ~torch.isnan(rewards))
    if args.adv_clip_range is not None:
        advantages = adv_fns.clip_advantages(advantages, args.adv_clip_range)
    return advantages


@torch.no_grad()
def sequence_kl(output: dict, score_logps: Callable[[bool], torch.Tensor]) -> torch.Tensor:
    """(B,) sum over loss tokens of log pi_old - log pi_ref (k1, verl's use_kl_in_reward).

    `score_logps(use_reference)` scores the rows when the batch lacks old / reference log-probs."""
    mask = output["completion_mask"] * output.get("tool_mask", 1)
    old = output.get("old_per_token_logps")
    old = score_logps(False) if old is None else old
    ref = output.get("ref_per_token_logps")
    ref = score_logps(True) if ref is None else ref
    return (losses.kl_penalty(old, ref, kind="k1") * mask).sum(dim=1)


def log_advantages(everything: torch.Tensor, metrics: dict) -> None:
    """Check (all ranks raise together) and log the advantages of the whole generation batch (all ranks)."""
    check_advantages_finite(everything)
    metrics["advantages/mean"].append(everything.mean().item())
    metrics["advantages/std"].append(everything.std().item() if everything.numel() > 1 else 0.0)
    metrics["advantages/max_abs"].append(everything.abs().max().item())


class ZeroSignalKinds:
    """Share of groups (all ranks) that are zero-signal at the top / bottom of the rewards seen so far."""

    def __init__(self, eps: float):
        self.eps = eps
        self.reward_range = (float("inf"), float("-inf"))  # lowest / highest reward seen

    def log(self, rewards: torch.Tensor, group_size: int, metrics: dict) -> None:
        scored = rewards[~torch.isnan(rewards)]
        if scored.numel():
            low, high = self.reward_range
            self.reward_range = (min(low, scored.min().item()), max(high, scored.max().item()))
        kinds = adv_fns.zero_signal_kinds(rewards, group_size, self.eps, *self.reward_range)
        for kind, name in adv_fns.KIND_NAMES.items():
            metrics[f"zero_signal/frac_groups_{name}"].append((kinds == kind).double().mean().item())


# (B,) bool key of a scored batch: rows of groups with signal; the others are dropped after TRL's split
SIGNAL_ROWS = "signal_rows"


def drop_micro_batch_rows(
    batches: list[dict],
    *,
    gather: Callable[[torch.Tensor], torch.Tensor],
    num_processes: int,
    pad_to_multiple_of: int | None,
    metrics: dict,
) -> list[dict]:
    """TRL's buffered micro-batches of one generation batch, each without its zero-signal rows (`SIGNAL_ROWS`).

    Rows never move between micro-batches, so each trains in the optimizer step TRL gives it. One all-gather of
    (kept rows, rows, kept loss tokens) per micro-batch; each micro-batch is padded to the row count all ranks agree
    on for it (`algos.filtering.micro_step_row_counts`). Records the generation-batch counts the normaliser reads
    (`algos.normalizer.micro_batch_normalizer`) in every micro-batch, deciding nothing: `num_items_in_batch` becomes
    the loss tokens of the kept rows (all ranks), `all_items_in_batch` keeps TRL's count, `kept_rows` / `all_rows`
    count rows over all ranks.
    """
    keeps = [b[SIGNAL_ROWS] for b in batches]
    local = torch.tensor(
        [
            [int(keep.sum()), keep.numel(), int((b["completion_mask"] * b.get("tool_mask", 1))[keep].sum())]
            for b, keep in zip(batches, keeps, strict=True)
        ],
        device=keeps[0].device,
    )
    counts = gather(local.unsqueeze(0)).view(num_processes, len(batches), 3).cpu()
    rows = micro_step_row_counts(counts[..., 0])
    kept_rows, all_rows, kept_tokens = (int(c) for c in counts.sum(dim=(0, 1)))
    all_tokens = batches[0]["num_items_in_batch"]
    scalars = {
        "num_items_in_batch": torch.tensor(kept_tokens, dtype=all_tokens.dtype, device=all_tokens.device),
        "all_items_in_batch": all_tokens,
        "kept_rows": torch.tensor(float(kept_rows), device=keeps[0].device),
        "all_rows": torch.tensor(float(all_rows), device=keeps[0].device),
    }
    out = []
    for batch, keep, num_rows in zip(batches, keeps, rows.tolist(), strict=True):
        batch = {k: v for k, v in batch.items() if k != SIGNAL_ROWS}
        out.append(keep_rows(batch, keep, num_rows, pad_to_multiple_of) | scalars)
    metrics["zero_signal/frac_rows_dropped"].append(1.0 - kept_rows / all_rows)
    metrics["zero_signal/rows_trained"].append(float(kept_rows))
    metrics["zero_signal/rows_padded"].append(float(int(rows.sum()) * num_processes - kept_rows))
    return out


def drop_rows(
    output: dict,
    keep: torch.Tensor,
    *,
    gather: Callable[[torch.Tensor], torch.Tensor],
    steps_per_generation: int,
    num_processes: int,
    pad_to_multiple_of: int | None,
    metrics: dict,
) -> dict:
    """Keep this rank's rows where `keep`, padded to the row count all ranks agree on (`algos.filtering`), before
    TRL's shuffle and split: dynamic sampling's selection of groups from several rounds.

    One all-gather of (kept rows, rows, kept loss tokens) per rank. Records the generation-batch counts the
    normaliser reads (`algos.normalizer.micro_batch_normalizer`), deciding nothing: `num_items_in_batch` becomes
    the loss tokens of the kept rows (all ranks); `all_items_in_batch` keeps TRL's count before dropping;
    `kept_rows` / `all_rows` count rows over all ranks. All are 0-dim, so TRL's split/shuffle hand them
    unchanged to every micro-batch.
    """
    loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
    counts = torch.tensor([int(keep.sum()), keep.numel(), int(loss_mask[keep].sum())], device=keep.device)
    counts = gather(counts).view(-1, 3)
    num_rows = agreed_row_count(int(counts[:, 0].max()), steps_per_generation)
    output = keep_rows(output, keep, num_rows, pad_to_multiple_of)
    kept_rows, all_rows, kept_tokens = (int(c) for c in counts.sum(dim=0))
    all_tokens = output["num_items_in_batch"]
    output["num_items_in_batch"] = torch.tensor(kept_tokens, dtype=all_tokens.dtype, device=all_tokens.device)
    output["all_items_in_batch"] = all_tokens
    output["kept_rows"] = torch.tensor(float(kept_rows), device=keep.device)
    output["all_rows"] = torch.tensor(float(all_rows), device=keep.device)
    metrics["zero_signal/frac_rows_dropped"].append(1.0 - kept_rows / all_rows)
    metrics["zero_signal/rows_trained"].append(float(kept_rows))
    metrics["zero_signal/rows_padded"].append(float(num_rows * num_processes - kept_rows))
    return output
