"""The rewards and advantages of TRL's scored generation batch (the output of `_generate_and_score_completions`):
grpo_hub's edits and their logs.

Called from the trainer's `_calculate_rewards` (reward clip / norm) and `_score_round` with narrow inputs
(tensors, settings, callables, the metrics dict): reward transforms, advantage recomputation (adv_norm, whitening,
clipping, KL in the reward), the advantage logs and the zero-signal kinds. The formulas live in `grpo_hub.algos`;
which rows train is grpo_hub.training.filtering's job.
"""

import contextlib
import copy
from collections.abc import Callable

import torch
from trl.trainer.utils import use_adapter

from grpo_hub.algos import advantages as adv_fns
from grpo_hub.algos import losses
from grpo_hub.config import features
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
        self.active = features.any_on(features.EDITS_REWARDS, args)
        self.moments = [adv_fns.RunningMoments() for _ in range(num_funcs)]

    def __call__(
        self, rewards_per_func: torch.Tensor, training: bool, weights: torch.Tensor, metrics
    ) -> torch.Tensor:
        """The transformed rewards; the raw reward (the batch's mean of TRL's `weighted_rewards`) is logged first,
        as `reward_raw` in `metrics` (those of the mode being run)."""
        metrics["reward_raw"].append(torch.nanmean(weighted_rewards(rewards_per_func, weights)).item())
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
    if features.is_on("whiten_advantages", args):
        advantages = adv_fns.whiten(advantages, ~torch.isnan(rewards))
    if features.is_on("adv_clip", args):
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


def rescored_logps(output: dict, use_reference: bool, *, peft_model, per_token_logps) -> torch.Tensor:
    """No-grad per-token log-probs of the policy, or of the PEFT base / "ref" adapter (`use_reference`), on the
    scored rows of `output`; `per_token_logps(ids, mask, logits_to_keep)` is TRL's scorer of the trained model."""
    ids, mask = (
        torch.cat([output[f"prompt_{k}"], output[f"completion_{k}"]], dim=1) for k in ("ids", "mask")
    )
    adapter = "ref" if use_reference and "ref" in peft_model.peft_config else None
    with use_adapter(peft_model, adapter_name=adapter) if use_reference else contextlib.nullcontext():
        return per_token_logps(ids, mask, output["completion_ids"].size(1))


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
