"""time_budget_seconds re-plans every transformers schedule that has a length: after the plan, each step's learning
rate is that of the same schedule built fresh for the planned length on an optimizer with the run's learning rate
(transformers reads it for `polynomial`'s `lr_end` and the `min_lr` of the cosine schedules with a floor)."""

import inspect

import pytest
import torch
from transformers import SchedulerType, get_scheduler
from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION

from grpo_hub.training.time_budget import schedule_rate
from tests.training.time_budget_helpers import budget_trainer, logged, scripted_clock

LR, FLOOR, PLANNED = 1e-6, 1e-7, 6  # the scripted clock and a 9.5 s budget plan 6 of the 20 steps
KWARGS = {  # what each schedule needs, with a floor where it has one
    SchedulerType.POLYNOMIAL: {"lr_end": FLOOR},
    SchedulerType.COSINE_WITH_MIN_LR: {"min_lr": FLOOR},
    SchedulerType.COSINE_WARMUP_WITH_MIN_LR: {"min_lr": FLOOR},
    SchedulerType.WARMUP_STABLE_DECAY: {"num_decay_steps": 2, "min_lr_ratio": 0.1},
}
WITH_LENGTH = [
    kind
    for kind, build in TYPE_TO_SCHEDULER_FUNCTION.items()
    if "num_training_steps" in inspect.signature(build).parameters
]


def fresh_rates(args, total: int) -> list[float]:
    """The learning rate of each of `total` steps: transformers' schedule built for `total` on the run's rate."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=args.learning_rate)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=args.get_warmup_steps(total),
        num_training_steps=total,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )
    rates = []
    for _ in range(total):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates


def test_every_schedule_with_a_length_is_checked():
    assert {SchedulerType.LINEAR, SchedulerType.COSINE, SchedulerType.POLYNOMIAL} <= set(WITH_LENGTH)


@pytest.mark.parametrize("kind", WITH_LENGTH, ids=lambda kind: kind.value)
def test_a_replanned_schedule_ends_at_the_rate_of_its_formula(tmp_path, tiny_model_dir, kind):
    trainer = budget_trainer(
        tmp_path,
        tiny_model_dir,
        scripted_clock(),
        learning_rate=LR,
        lr_scheduler_type=kind.value,
        lr_scheduler_kwargs=KWARGS.get(kind, {}),
        warmup_steps=0.25,  # a fraction of the planned length too
        time_budget_calibration_steps=2,
    )
    trainer.train()
    assert trainer.state.global_step == PLANNED
    # steps 3-6 run after the plan made at step 2 (the calibration step)
    rates = logged(trainer, "learning_rate")[2:]
    assert rates == pytest.approx(fresh_rates(trainer.args, PLANNED)[2:], rel=1e-6, abs=1e-15)


class ZeroOptimizerLike:
    """What DeepSpeed's ZeRO optimizers expose: the parameter groups and the wrapped optimizer (`.optimizer`), no
    `defaults` (accelerate's `AcceleratedOptimizer.defaults` then raises AttributeError)."""

    def __init__(self, optimizer):
        self.optimizer, self.param_groups = optimizer, optimizer.param_groups


def test_the_rate_is_read_through_deepspeeds_optimizer_wrappers():
    from accelerate.optimizer import AcceleratedOptimizer

    inner = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.3)
    wrapped = AcceleratedOptimizer(ZeroOptimizerLike(inner), device_placement=False)
    assert schedule_rate(wrapped) == 0.3
    assert schedule_rate(inner) == 0.3
