"""Hint rules (grpo_hub.algos.hints) against naive references on random inputs, and their edge cases."""

import math
import random

import pytest

from grpo_hub.algos import hints


def naive_ceiling(steps: int, progress: float, end: float) -> int:
    """The largest k <= steps - 1 with k <= (1 - progress / end) * (steps - 1), rounded up; 0 once progress >= end."""
    most = max(steps - 1, 0)
    if progress >= end:
        return 0
    allowed = (1 - progress / end) * most
    return next(k for k in range(most + 1) if k >= allowed - 1e-9)


def naive_next(used: int, outcomes: list[bool], shorten_at: float, most: int) -> int:
    if not outcomes:
        return used
    if not any(outcomes):
        return min(used + 1, most)
    if sum(outcomes) >= shorten_at * len(outcomes):
        return max(used - 1, 0)
    return used


def test_solution_steps_split_strip_and_keep_lists():
    assert hints.solution_steps("37+5=42,42*3=126", ",") == ["37+5=42", "42*3=126"]
    assert hints.solution_steps("a\nb\n", "\n") == ["a", "b"]  # a trailing separator makes no empty step
    assert hints.solution_steps(["x = 1", "y = 2"], "\n") == ["x = 1", "y = 2"]
    assert hints.solution_steps("no separator here", ",") == ["no separator here"]
    assert hints.solution_steps("", ",") == []
    with pytest.raises(ValueError, match="string or a list of strings"):
        hints.solution_steps(42, ",")


def test_a_hint_is_the_first_steps_each_followed_by_the_separator_and_never_the_last_step():
    steps = ["37+5=42", "42*3=126", "126-4=122"]
    assert hints.hint_text(steps, 0, ",") == ""
    assert hints.hint_text(steps, 2, ",") == "37+5=42,42*3=126,"
    assert hints.longest_hint(3) == 2 and hints.longest_hint(1) == 0 and hints.longest_hint(0) == 0
    with pytest.raises(ValueError, match="0..2 steps"):
        hints.hint_text(steps, 3, ",")
    with pytest.raises(ValueError, match="0..0 steps"):
        hints.hint_text(["only"], 1, ",")


def test_the_ceiling_falls_linearly_to_zero_at_the_end():
    rng = random.Random(0)
    for _ in range(2000):
        steps, end = rng.randint(0, 12), rng.choice([0.25, 0.5, 0.8, 1.0, rng.uniform(0.01, 1)])
        progress = rng.choice([0.0, 1.0, end, rng.random()])
        assert hints.hint_ceiling(steps, progress, end) == naive_ceiling(steps, progress, end), (
            steps,
            progress,
            end,
        )
    assert [hints.hint_ceiling(4, p, 1.0) for p in (0.0, 0.3, 0.34, 0.66, 0.67, 0.99, 1.0)] == [
        3,
        3,
        2,
        2,
        1,
        1,
        0,
    ]
    assert hints.hint_ceiling(4, 0.6, 0.5) == 0  # past the end: no hints
    for end in (0.0, 1.5, -1.0, math.nan):
        with pytest.raises(ValueError, match="end must lie in"):
            hints.hint_ceiling(4, 0.1, end)


def test_the_length_grows_while_none_is_right_and_shrinks_once_enough_are():
    rng = random.Random(1)
    for _ in range(3000):
        most = rng.randint(0, 6)
        used = rng.randint(0, most)
        outcomes = [rng.random() < rng.choice([0.0, 0.1, 0.5, 0.9, 1.0]) for _ in range(rng.randint(0, 16))]
        shorten_at = rng.choice([0.25, 0.5, 1.0, rng.uniform(0.01, 1)])
        got = hints.next_hint_length(used, sum(outcomes), len(outcomes), shorten_at, most)
        assert got == naive_next(used, outcomes, shorten_at, most)
    assert hints.next_hint_length(3, 0, 8, 0.5, 3) == 3  # already the longest
    assert hints.next_hint_length(0, 8, 8, 0.5, 3) == 0  # already none
    assert hints.next_hint_length(2, 0, 0, 0.5, 3) == 2  # nothing scored
    with pytest.raises(ValueError, match="right must lie"):
        hints.next_hint_length(1, 9, 8, 0.5, 3)


def test_a_length_is_decided_once_a_window_of_completions_is_scored():
    rng = random.Random(2)
    for _ in range(2000):
        most, window = rng.randint(0, 5), rng.randint(1, 40)
        length, right, scored = rng.randint(0, most), 0, 0
        for _ in range(rng.randint(1, 6)):
            batch = [rng.random() < 0.3 for _ in range(rng.randint(0, 16))]
            right, scored = right + sum(batch), scored + len(batch)
            expected = (length, right, scored)
            if scored >= window:
                expected = (naive_next(length, [True] * right + [False] * (scored - right), 0.5, most), 0, 0)
            assert hints.windowed_hint_length(length, right, scored, window, 0.5, most) == expected
            length, right, scored = expected
    # one all-wrong batch of 8 does not hint a state that is right a quarter of the time; a window of 32 decides
    assert hints.windowed_hint_length(0, 0, 8, 32, 0.5, 3) == (0, 0, 8)
    assert hints.windowed_hint_length(0, 8, 32, 32, 0.5, 3) == (0, 0, 0)
    assert hints.windowed_hint_length(0, 0, 32, 32, 0.5, 3) == (1, 0, 0)
