"""The policy-loss surrogates, each registered once with its behaviour (verl's `register_policy_loss` pattern):
the per-token loss the own loss path computes, the clip metrics it logs, whether a dual clip applies and whether
epsilon_high is an absolute ratio cap. Adding a surrogate is one decorated function (and its loss-type entry in
`loss_types.REGISTRY`). Pure torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo_hub.algos import losses


@dataclass(frozen=True)
class Bounds:
    """The ratio bounds of one loss: the clip range (relative, or `high` absolute for an absolute cap) and the
    dual-clip cap."""

    low: float
    high: float
    dual_clip: float | None = None


@dataclass(frozen=True)
class Surrogate:
    name: str
    # (ratio, advantages, logp, bounds) -> per-token loss; None: only TRL's `_compute_loss` computes it
    loss: Callable | None
    # (ratio, advantages, bounds) -> {TRL's metric name: bool tensor of the clipped tokens}
    clipped: Callable | None = None
    dual_clip: bool = False  # dual-clip (dual_clip_c / TRL's delta) applies
    absolute_cap: bool = False  # epsilon_high caps the ratio itself, not 1 + epsilon_high


SURROGATES: dict[str, Surrogate] = {
    "soft": Surrogate("soft", None),  # SAPO (TRL 1.16)
    "vespo": Surrogate("vespo", None),  # VESPO (TRL 1.16)
}


def register_surrogate(name: str, *, clipped: Callable, dual_clip: bool = False, absolute_cap: bool = False):
    """Register the decorated per-token loss as the surrogate `name`."""

    def register(loss: Callable) -> Callable:
        if name in SURROGATES:
            raise ValueError(f"surrogate {name!r} is registered twice")
        SURROGATES[name] = Surrogate(name, loss, clipped, dual_clip, absolute_cap)
        return loss

    return register


def ppo_clipped_tokens(ratio: torch.Tensor, advantages: torch.Tensor, b: Bounds) -> dict[str, torch.Tensor]:
    """Tokens whose ratio the PPO clip (or the dual clip) holds, under TRL's metric names."""
    low = (ratio < 1 - b.low) & (advantages < 0)
    high = (ratio > 1 + b.high) & (advantages > 0)
    regions = {"clip_ratio/low_mean": low, "clip_ratio/high_mean": high, "clip_ratio/region_mean": low | high}
    if b.dual_clip is not None:
        regions["clip_ratio/dual_mean"] = (ratio > b.dual_clip) & (advantages < 0)
    return regions


@register_surrogate("clip", clipped=ppo_clipped_tokens, dual_clip=True)
def ppo_clip(ratio: torch.Tensor, advantages: torch.Tensor, logp: torch.Tensor, b: Bounds) -> torch.Tensor:
    """PPO's clipped surrogate with DAPO's asymmetric range and an optional dual clip (`losses.clipped_surrogate`)."""
    return losses.clipped_surrogate(ratio, advantages, b.low, b.high, dual_clip=b.dual_clip)


def cispo_capped_tokens(ratio: torch.Tensor, advantages: torch.Tensor, b: Bounds) -> dict[str, torch.Tensor]:
    """Tokens whose weight the CISPO cap holds (TRL's `cispo_clip_ratio`)."""
    return {"cispo_clip_ratio": (ratio > b.high) & (advantages > 0)}


@register_surrogate("cispo", clipped=cispo_capped_tokens, absolute_cap=True)
def cispo(ratio: torch.Tensor, advantages: torch.Tensor, logp: torch.Tensor, b: Bounds) -> torch.Tensor:
    """MiniMax-M1's CISPO with TRL's absolute cap epsilon_high (`losses.cispo_loss`)."""
    return losses.cispo_loss(ratio, advantages, logp, high=b.high)
