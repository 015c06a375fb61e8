"""The length of a run trained for a wall-clock budget (`GRPOHubConfig.time_budget_seconds`).

The pace is the mean wall time of the optimizer steps other than each process's first (the first step of a run, and
of every process that resumed it, also pays the warm-up: the first generation, compilation, the server's first
batch). The plan is re-made after every step from the pace so far,
so a run that slows down (longer completions) ends its schedule at the budget too.
"""

from __future__ import annotations

import math


def seconds_per_step(step: int, elapsed: float, warm_up_seconds: float, warm_up_steps: int) -> float:
    """Mean wall seconds per optimizer step over steps 1..`step` less the `warm_up_steps` first steps of the processes
    that ran them, which took `warm_up_seconds` together (`elapsed`: wall seconds at the end of step `step`):
    (elapsed - warm_up_seconds) / (step - warm_up_steps). Needs a step that was not a process's first."""
    if step <= warm_up_steps:
        raise ValueError(
            f"the pace needs a step after a warm-up, got step {step} with {warm_up_steps} warm-up steps"
        )
    return max(elapsed - warm_up_seconds, 0.0) / (step - warm_up_steps)


def planned_steps(step: int, elapsed: float, pace: float, budget: float, cap: int) -> int:
    """Optimizer steps of the whole run: the `step` done so far, plus every further step that ends within `budget`
    wall seconds at `pace` seconds per step (none once the budget is spent), at most `cap` (the run's length without
    a budget). The last planned step is the last one that ends inside the budget at the measured pace."""
    if pace <= 0:
        return cap
    remaining = max(budget - elapsed, 0.0)
    # the small tolerance keeps a step that fits exactly (remaining / pace an integer) from rounding down
    return min(cap, step + math.floor(remaining / pace + 1e-9))
