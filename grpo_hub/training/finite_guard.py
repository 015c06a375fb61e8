"""Weights never become NaN/inf: the optimizer step is refused when a gradient is not finite.

Finite rewards can still overflow float32 in the loss or its gradient (e.g. rewards near 3e38 with
adv_norm='no_baseline'); gradient clipping then multiplies an infinite norm's 0 coefficient into inf, giving NaN, and
the optimizer writes NaN into every weight (the next step dies in sampling). `FiniteGradientsCallback` checks the
clipped gradients before `optimizer.step()` and raises instead. Gradients are reduced over ranks before this
point (DDP), so every rank raises together; partitioned gradients (ZeRO, FSDP) are checked per shard. Under fp16
mixed precision the gradient scaler already skips a step with inf gradients (and lowers its scale), which is
normal there: the check is off.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback


def local_part(grad: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a gradient: FSDP2's are DTensors, whose `.tolist()` torch refuses (a run failed there)."""
    return grad.to_local() if hasattr(grad, "to_local") else grad


def nonfinite_gradients(model: torch.nn.Module) -> list[str]:
    """Names of the parameters whose gradient (this rank's shard of it) holds a NaN or an inf."""
    named = [(name, local_part(p.grad)) for name, p in model.named_parameters() if p.grad is not None]
    if not named:
        return []
    finite = torch.stack([torch.isfinite(grad).all() for _, grad in named]).tolist()
    return [name for (name, _), ok in zip(named, finite, strict=True) if not ok]


class FiniteGradientsCallback(TrainerCallback):
    """Raise FloatingPointError before an optimizer step that would write NaN/inf into the weights."""

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if args.fp16:  # the GradScaler skips non-finite steps itself
            return
        bad = nonfinite_gradients(model)
        if bad:
            shown = ", ".join(bad[:3]) + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else "")
            raise FloatingPointError(
                f"optimizer step {state.global_step + 1}: non-finite gradients in {shown}; the step was not taken, "
                "so the weights are unchanged. Fix: scale the rewards down (or set reward_clip / reward_norm), "
                "lower learning_rate, or train in float32."
            )
