"""grpo_hub.algos.time_budget against a step-by-step simulation of the clock."""

import random

import pytest

from grpo_hub.algos.time_budget import planned_steps, seconds_per_step


def naive_plan(step, elapsed, pace, budget, cap):
    """Walk the clock forward one step at a time while the next step still ends inside the budget."""
    total, clock = step, elapsed
    while total < cap and pace > 0 and clock + pace <= budget + 1e-9:
        total, clock = total + 1, clock + pace
    return cap if pace <= 0 else total


def test_the_plan_matches_a_step_by_step_clock_on_random_inputs():
    rng = random.Random(0)
    for _ in range(2000):
        step, pace = rng.randint(2, 50), rng.uniform(0.01, 5.0)
        elapsed, budget, cap = rng.uniform(0, 200), rng.uniform(0, 300), rng.randint(step, 400)
        assert planned_steps(step, elapsed, pace, budget, cap) == naive_plan(step, elapsed, pace, budget, cap)


@pytest.mark.parametrize(
    ("step", "elapsed", "pace", "budget", "cap", "expected"),
    [
        (4, 4.0, 1.0, 10.0, 100, 10),  # a step that ends exactly at the budget is planned
        (4, 4.0, 1.0, 9.99, 100, 9),
        (4, 12.0, 1.0, 10.0, 100, 4),  # budget spent: stop at the step done
        (4, 4.0, 1.0, 1000.0, 50, 50),  # the budget fits more than the cap: the cap
        (4, 4.0, 0.0, 10.0, 50, 50),  # no measurable pace: the cap
    ],
)
def test_plan_edges(step, elapsed, pace, budget, cap, expected):
    assert planned_steps(step, elapsed, pace, budget, cap) == expected


def test_the_pace_leaves_out_the_first_step():
    ends = [30.0, 31.0, 33.0, 36.0]  # step 1 pays a 30 s warm-up; then 1, 2, 3 s
    assert seconds_per_step(4, ends[3], ends[0], 1) == pytest.approx(sum([1.0, 2.0, 3.0]) / 3)
    with pytest.raises(ValueError, match="a step after a warm-up"):
        seconds_per_step(1, 30.0, 30.0, 1)


def test_the_pace_leaves_out_every_processs_first_step():
    """A run resumed at step 3: its process's first step (step 4) pays a warm-up too (20 s); the pace is the mean of
    the other steps (2, 3, 5, 6: 1, 2, 3, 4 s), whatever the warm-ups cost."""
    durations = [30.0, 1.0, 2.0, 20.0, 3.0, 4.0]  # steps 1-6
    warm_up = durations[0] + durations[3]
    assert seconds_per_step(6, sum(durations), warm_up, 2) == pytest.approx(sum([1.0, 2.0, 3.0, 4.0]) / 4)
    with pytest.raises(ValueError, match="a step after a warm-up"):
        seconds_per_step(2, 31.0, 31.0, 2)  # resumed at step 1: steps 1 and 2 were both a process's first
