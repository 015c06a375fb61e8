"""The learning-rate schedule `time_budget_seconds` re-plans: transformers' `lr_scheduler_type` for any run length."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import get_scheduler

from grpo_hub.errors import field_message


def schedule_multiplier(args, total: int, learning_rate: float) -> Callable[[int], float]:
    """The learning-rate multiplier by optimizer step of transformers' `args.lr_scheduler_type` (warmup from
    `args.get_warmup_steps`) for a run of `total` steps: what `Trainer.create_scheduler` builds for that length on
    an optimizer whose learning rate (`optimizer.defaults["lr"]`) is `learning_rate`. transformers reads that rate
    for the floors `polynomial`'s `lr_end` and the cosine schedules' `min_lr`: their multiplier is floor / rate."""
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=learning_rate)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer=probe,
        num_warmup_steps=args.get_warmup_steps(total),
        num_training_steps=total,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )
    if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        schedule_name = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)  # transformers' enum
        raise ValueError(
            field_message(
                "time_budget_seconds",
                f"re-plans the learning-rate schedule's length, which lr_scheduler_type={schedule_name!r} "
                "does not have.",
                "use a schedule by step (e.g. 'linear', 'cosine', 'constant_with_warmup'), or time_budget_seconds=None.",
            )
        )
    return scheduler.lr_lambdas[0]
