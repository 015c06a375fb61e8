"""A scripted clock and the tiny trainer with a time budget, shared by the time-budget tests."""

import itertools

from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import make_trainer, tiny_config

LR, CAP, WARM_UP = 1e-2, 20, 3.0


def scripted_clock(start: float = 0.0):
    """Wall seconds read by the callback: `start` at train begin, then WARM_UP + 1 at step 1's end and 1 s more at
    each later step's (the callback reads the clock once at train begin and once per optimizer step)."""
    reads = itertools.count()
    return lambda: start + (lambda n: 0.0 if n == 0 else WARM_UP + n)(next(reads))


def budget_trainer(tmp_path, model_dir, clock, eval_dataset=None, **overrides):
    settings = {"max_steps": CAP, "learning_rate": LR, "time_budget_seconds": 9.5, **overrides}
    trainer = make_trainer(
        GRPOHubTrainer, model_dir, tiny_config(tmp_path, **settings), eval_dataset=eval_dataset
    )
    trainer._time_budget.clock = clock
    return trainer


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry and "loss" in entry]
