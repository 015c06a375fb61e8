"""Training for a wall-clock budget (`GRPOHubConfig.time_budget_seconds`).

From optimizer step `time_budget_calibration_steps` on, after every step, the run's length (`TrainerState.max_steps`,
which ends the loop) and the learning-rate schedule (transformers' `lr_scheduler_type` with its warmup, rebuilt for
that length) are planned to the steps that fit in the budget (grpo_hub.algos.time_budget). Every rank plans from the
slowest rank's clock, so all ranks stop at the same step. The training seconds spent so far are saved in each
checkpoint and count on resume; the pace leaves out the first step of the run and of each process that resumed it (a
warm-up).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable

import torch
from transformers import TrainerCallback

from grpo_hub.algos import time_budget
from grpo_hub.config.lr_schedule import schedule_multiplier
from grpo_hub.errors import field_message
from grpo_hub.training.reference import resume_folder

STATE_FILE = "time_budget.json"
PLANNED_METRIC = "time_budget/planned_steps"


def slowest(seconds: float, device: torch.device) -> float:
    """The largest of every rank's `seconds` (a MAX all-reduce over torch.distributed's default group, on `device`:
    the backend's); `seconds` itself outside a process group. Not accelerate's `reduce(reduction="max")`: up to
    accelerate 1.13 that sums (max from 1.14, PR #4027), and `accelerate>=1.4` is allowed."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return seconds
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return value.item()


def schedule_rate(optimizer) -> float:
    """The learning rate transformers' schedules read (`optimizer.defaults["lr"]`), through the wrappers that have
    no `defaults` of their own (DeepSpeed's ZeRO optimizers, seen through accelerate's): each keeps the optimizer it
    wraps as `.optimizer`."""
    while True:
        try:
            return optimizer.defaults["lr"]
        except AttributeError:
            optimizer = optimizer.optimizer


def set_schedule_length(
    scheduler: torch.optim.lr_scheduler.LambdaLR, multiplier: Callable[[int], float]
) -> None:
    """Make `multiplier` the schedule of every parameter group, and the learning rate of the coming step its value."""
    groups = scheduler.optimizer.param_groups
    scheduler.lr_lambdas = [multiplier] * len(groups)
    for group, base in zip(groups, scheduler.base_lrs, strict=True):
        group["lr"] = base * multiplier(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in groups]


class TimeBudgetCallback(TrainerCallback):
    """Plan the run's length to `budget` wall seconds after every optimizer step (module docstring).

    `schedule`: (total steps, the optimizer's learning rate) -> the learning-rate multiplier by step
    (`schedule_multiplier`); `reduce_max`: a float's maximum over the ranks; `metrics`: the trainer's train metrics
    (logs the planned length); `clock`: wall seconds."""

    def __init__(
        self, budget: float, calibration_steps: int, schedule, reduce_max, metrics, clock=time.monotonic
    ):
        self.budget, self.calibration_steps, self.schedule = budget, calibration_steps, schedule
        self.reduce_max, self.metrics, self.clock = reduce_max, metrics, clock
        # set by GRPOHubTrainer: `create_scheduler`, and `train(resume_from_checkpoint=<path>)` (read by the
        # train() call it was given to: on_train_begin clears it)
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self.resume_from: str | None = None
        # wall seconds spent before this train() call and at the end of the last step; the warm-up: the seconds and
        # the count of the steps that were a process's first (the run's, and each resumed process's)
        self.spent = None
        # the upper bound (the length without a budget), the clock at train begin, the scheduler's length
        self._cap = self._started = self._length = None
        self._warming = False  # no step of this train() call has ended yet

    @classmethod
    def from_config(cls, args, device: torch.device, metrics) -> TimeBudgetCallback:
        """The callback of a GRPOHubConfig's `time_budget_*` fields: its schedule `schedule_multiplier` (transformers'
        `lr_scheduler_type` with its warmup), the ranks' clocks compared over `device`'s backend (`slowest`)."""
        return cls(
            args.time_budget_seconds,
            args.time_budget_calibration_steps,
            functools.partial(schedule_multiplier, args),
            functools.partial(slowest, device=device),
            metrics,
        )

    def elapsed(self) -> float:
        """Training seconds of the run so far, those before a resumed checkpoint included."""
        return self.spent["before"] + self.clock() - self._started

    def on_train_begin(self, args, state, control, **kwargs):
        if self.scheduler is None:
            raise ValueError(
                field_message(
                    "time_budget_seconds",
                    "re-plans the learning-rate schedule the trainer creates, but none was created (a DeepSpeed "
                    "config with its own 'scheduler' section, or a scheduler passed to the trainer).",
                    "remove that scheduler (lr_scheduler_type sets the schedule), or set time_budget_seconds=None.",
                )
            )
        self._cap = self._length = state.max_steps  # max_steps, or the epochs' steps: the scheduler's length
        # every train() call starts afresh: a second call on the same trainer keeps nothing of the first
        self.spent = {"before": 0.0, "warm_up": (0.0, 0), "last": 0.0}
        self._warming = True
        resume_from, self.resume_from = self.resume_from, None
        if state.global_step > 0:
            self._restore(args, state, resume_from)
        self._started = self.clock()

    def _restore(self, args, state, resume_from: str | None) -> None:
        folder = resume_folder(args, state.global_step, resume_from, filename=STATE_FILE)
        if folder is None:
            raise ValueError(
                field_message(
                    "time_budget_seconds",
                    f"resuming at step {state.global_step}, but no {STATE_FILE} was found in the resumed checkpoint, "
                    "so the seconds already spent are unknown.",
                    "resume from a checkpoint saved with time_budget_seconds set (its folder passed to "
                    "`trainer.train(resume_from_checkpoint=...)`), or set time_budget_seconds=None.",
                )
            )
        with open(os.path.join(folder, STATE_FILE)) as file:
            saved = json.load(file)
        # a checkpoint saved before the resumed processes' warm-ups were counted has step 1's end only
        warm_up = (
            (saved["first_step"], 1)
            if "first_step" in saved
            else (saved["warm_up_seconds"], saved["warm_up_steps"])
        )
        self.spent = {"before": saved["elapsed"], "warm_up": warm_up, "last": saved["elapsed"]}
        self._plan(args, state, saved["planned_steps"])
        self._fit_schedule(state)

    @staticmethod
    def _plan(args, state, total: int) -> None:
        """Make `total` the run's length (`state.max_steps`: the flow callback ends the run there), and the logging,
        eval and save steps given as fractions (< 1) fractions of it (`TrainerState.compute_steps`, which transformers
        runs once, for the upper bound)."""
        state.max_steps = total
        state.compute_steps(args, total)

    def _fit_schedule(self, state) -> None:
        """Rebuild the schedule for the planned length `state.max_steps` when the scheduler has another length (the
        upper bound's at first, then the last plan's); the learning rate of the coming step is set at once."""
        if state.max_steps != self._length:
            multiplier = self.schedule(state.max_steps, schedule_rate(self.scheduler.optimizer))
            set_schedule_length(self.scheduler, multiplier)
            self._length = state.max_steps

    def on_optimizer_step(self, args, state, control, **kwargs):
        """Plan the run's length (`state.max_steps`) at the end of the step's update. transformers calls this before
        it counts the step (`global_step` + 1) and before `on_step_end`, where its flow callback reads
        `state.max_steps`: a plan that ends the run at this step gets the final save and evaluation of max_steps,
        and a plan that grows at the step the old plan ended on does not stop the run."""
        step, elapsed = state.global_step + 1, self.reduce_max(self.elapsed())
        if self._warming:  # this process's first step
            self._warming = False
            seconds, steps = self.spent["warm_up"]
            self.spent["warm_up"] = (seconds + elapsed - self.spent["before"], steps + 1)
        self.spent["last"] = elapsed
        # the pace needs a step after the warm-ups (and calibration_steps >= 2: config check)
        if step >= self.calibration_steps and step > self.spent["warm_up"][1]:
            pace = time_budget.seconds_per_step(step, elapsed, *self.spent["warm_up"])
            self._plan(args, state, time_budget.planned_steps(step, elapsed, pace, self.budget, self._cap))
        elif elapsed >= self.budget:  # spent before the pace is known: stop here
            self._plan(args, state, step)

    def on_step_end(self, args, state, control, **kwargs):
        """The schedule of the coming steps (after the scheduler's own step), and the planned length logged."""
        self._fit_schedule(state)
        self.metrics[PLANNED_METRIC].append(float(state.max_steps))

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            os.makedirs(folder, exist_ok=True)
            saved = {
                "elapsed": self.spent["last"],
                "warm_up_seconds": self.spent["warm_up"][0],
                "warm_up_steps": self.spent["warm_up"][1],
                "planned_steps": state.max_steps,
            }
            with open(os.path.join(folder, STATE_FILE), "w") as file:
                json.dump(saved, file)
