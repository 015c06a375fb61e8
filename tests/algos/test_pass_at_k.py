"""pass@k and both-outcome probabilities (grpo_hub.algos.pass_at_k) against enumeration of every subset of the samples,
exact fractions, edge cases and bad input."""

import itertools
import math
from fractions import Fraction

import pytest

from grpo_hub.algos.pass_at_k import both_outcomes_in_group, pass_at_k

SMALL = [(n, c) for n in range(1, 9) for c in range(n + 1)]


def subsets(n: int, c: int, k: int):
    """Every k-subset of n samples whose first c are right, as tuples of booleans (True = right)."""
    outcomes = [True] * c + [False] * (n - c)
    return [tuple(outcomes[i] for i in chosen) for chosen in itertools.combinations(range(n), k)]


def naive_pass(n: int, c: int, k: int) -> float:
    """Share of the k-subsets that hold at least one right sample."""
    drawn = subsets(n, c, k)
    return sum(any(s) for s in drawn) / len(drawn)


def naive_both(n: int, c: int, g: int) -> float:
    """Share of the g-subsets that hold a right and a wrong sample."""
    drawn = subsets(n, c, g)
    return sum(any(s) and not all(s) for s in drawn) / len(drawn)


@pytest.mark.parametrize(("n", "c"), SMALL)
def test_pass_at_k_is_the_share_of_subsets_with_a_right_sample(n, c):
    for k in range(1, n + 1):
        assert pass_at_k(n, c, k) == pytest.approx(naive_pass(n, c, k), abs=1e-12), (n, c, k)


@pytest.mark.parametrize(("n", "c"), SMALL)
def test_both_outcomes_is_the_share_of_subsets_with_both(n, c):
    for g in range(1, n + 1):
        assert both_outcomes_in_group(n, c, g) == pytest.approx(naive_both(n, c, g), abs=1e-12), (n, c, g)


@pytest.mark.parametrize(
    ("n", "c", "k"), [(64, 1, 8), (64, 5, 16), (64, 32, 32), (200, 3, 100), (500, 17, 64)]
)
def test_large_n_matches_exact_binomials(n, c, k):
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)
    both = 1 - Fraction(math.comb(c, k) + math.comb(n - c, k), math.comb(n, k))
    assert both_outcomes_in_group(n, c, k) == pytest.approx(float(both), rel=1e-12, abs=1e-15)


def test_huge_n_stays_finite_and_in_range():
    value = pass_at_k(10**6, 3, 1000)  # C(10**6, 1000) overflows a float; the product form does not
    assert 0 < value < 1
    assert value == pytest.approx(1 - (1 - 1000 / 10**6) ** 3, rel=1e-3)


def test_edges():
    assert pass_at_k(64, 0, 64) == 0.0  # never right
    assert pass_at_k(64, 64, 1) == 1.0  # always right
    assert pass_at_k(64, 1, 64) == 1.0  # k = n: the one right sample is drawn
    assert pass_at_k(10, 7, 4) == 1.0  # k > n - c: every k-subset holds a right sample
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the share of right samples
    assert both_outcomes_in_group(64, 0, 8) == 0.0
    assert both_outcomes_in_group(64, 64, 8) == 0.0
    assert both_outcomes_in_group(64, 20, 1) == 0.0  # one completion holds one outcome
    assert both_outcomes_in_group(10, 3, 10) == 1.0  # the whole set holds both
    assert both_outcomes_in_group(10, 3, 8) == 1.0  # more than either side: both are drawn


def test_both_outcomes_is_pass_of_right_and_of_wrong_minus_one():
    for n, c in SMALL:
        for g in range(1, n + 1):
            expected = pass_at_k(n, c, g) + pass_at_k(n, n - c, g) - 1
            assert both_outcomes_in_group(n, c, g) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 0, 1), "n must be"),
        ((8, -1, 1), "c must be"),
        ((8, 9, 1), "c must be"),
        ((8, 2, 0), "must be"),
        ((8, 2, 9), "must be"),
        ((8.0, 2, 1), "integer"),
        ((8, 2.5, 1), "integer"),
        ((8, 2, True), "integer"),
    ],
)
def test_bad_input(args, message):
    for function in (pass_at_k, both_outcomes_in_group):
        with pytest.raises((ValueError, TypeError), match=message):
            function(*args)
