"""Knapsack RL rollout budgets (grpo_hub.algos.rollout_budget) against enumeration of outcomes and of allocations,
a dynamic program, random inputs and edge cases."""

import itertools
import math
import random

import pytest
import torch

from grpo_hub.algos import rollout_budget as rb

SPECIAL_P = [0.0, 1.0, 0.5, 1 / 3, 0.05, 0.95, 1e-17]


def naive_nonzero(p: float, n: int) -> float:
    """Sum of the probabilities of every outcome sequence of n Bernoulli(p) draws that has a success and a failure."""
    terms = []
    for seq in itertools.product([0, 1], repeat=n):
        wins = sum(seq)
        if 0 < wins < n:
            terms.append(p**wins * (1 - p) ** (n - wins))
    return math.fsum(terms)


def naive_value(p: float, n: int) -> float:
    return naive_nonzero(p, n) * p * (1 - p) ** 2


def allocations(count: int, total: int, low: int, high: int):
    """Every integer vector of `count` entries in [low, high] summing to `total`."""
    if count == 0:
        if total == 0:
            yield ()
        return
    for first in range(low, high + 1):
        rest = total - first
        if (count - 1) * low <= rest <= (count - 1) * high:
            for tail in allocations(count - 1, rest, low, high):
                yield (first, *tail)


def naive_objective_value(p: float, n: int, name: str) -> float:
    """An objective's value of a group of n at p: Knapsack RL's value, or P_nonzero alone ("signal")."""
    return rb.budget_value(p, n) if name == "knapsack" else rb.nonzero_gradient_probability(p, n)


def objective(probs, budgets, name: str = "knapsack") -> float:
    return sum(naive_objective_value(p, n, name) for p, n in zip(probs, budgets, strict=True))


def dp_optimum(probs, total: int, low: int, high: int, name: str = "knapsack") -> float:
    """Best objective by the paper's dynamic program over prompts and spent budget (no concavity assumed)."""
    best = {0: 0.0}
    for p in probs:
        values = {n: naive_objective_value(p, n, name) for n in range(low, high + 1)}
        nxt = {}
        for spent, v in best.items():
            for n, gain in values.items():
                if spent + n <= total:
                    nxt[spent + n] = max(nxt.get(spent + n, -math.inf), v + gain)
        best = nxt
    return best[total]


def random_p(rng: random.Random) -> float:
    return rng.choice(SPECIAL_P) if rng.random() < 0.4 else rng.random()


# --- value functions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(0, 11))
def test_nonzero_probability_matches_enumerating_every_outcome_sequence(n):
    rng = random.Random(n)
    for p in [*SPECIAL_P, *(rng.random() for _ in range(10))]:
        assert rb.nonzero_gradient_probability(p, n) == pytest.approx(naive_nonzero(p, n), abs=1e-14)
        assert rb.budget_value(p, n) == pytest.approx(naive_value(p, n), abs=1e-14)


def test_value_edge_cases():
    for p in (0.0, 1.0):  # every group is all-fail or all-pass: no gradient, no value
        assert rb.nonzero_gradient_probability(p, 8) == 0.0 and rb.budget_value(p, 8) == 0.0
    for n in (0, 1):  # fewer than 2 completions never hold both outcomes
        assert rb.nonzero_gradient_probability(0.5, n) == 0.0
    assert rb.nonzero_gradient_probability(0.5, 2) == 0.5
    assert rb.info_gain(1 / 3) == pytest.approx(4 / 27) and rb.info_gain(0.5) == 0.125
    # a tiny p does not cancel to 0: 1 - (1-p)^n - p^n ~= n p
    assert rb.nonzero_gradient_probability(1e-20, 10) == pytest.approx(1e-19, rel=1e-9)
    assert rb.nonzero_gradient_probability(1 - 1e-12, 10) == pytest.approx(1e-11, rel=1e-3)
    assert rb.nonzero_gradient_probability(torch.tensor(0.5), 3) == 0.75  # a 0-d tensor is a number


def test_marginal_gain_is_the_value_difference_and_non_increasing():
    rng = random.Random(0)
    for _ in range(200):
        p, n = random_p(rng), rng.randint(1, 40)
        gain = rb.marginal_gain(p, n)
        assert gain == pytest.approx(rb.budget_value(p, n + 1) - rb.budget_value(p, n), abs=1e-15)
        assert rb.marginal_gain(p, n + 1) <= gain


@pytest.mark.parametrize(("p", "n"), [(-0.1, 2), (1.5, 2), (math.nan, 2), (0.5, -1), (0.5, 2.5), (0.5, True)])
def test_value_functions_reject_bad_inputs(p, n):
    with pytest.raises(ValueError):
        rb.budget_value(p, n)


# --- allocation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", rb.OBJECTIVES)
def test_allocation_matches_brute_force_on_random_cases(name):
    rng = random.Random(1)
    for _ in range(400):
        count = rng.randint(1, 4)
        low = rng.randint(1, 4)
        high = rng.randint(low, 8)
        total = rng.randint(count * low, min(count * high, 16)) if count * low <= 16 else count * low
        probs = [random_p(rng) for _ in range(count)]
        if rng.random() < 0.3:  # repeated estimates
            probs = [probs[0]] * count
        budgets = rb.allocate_budgets(probs, total, low, high, name)
        assert sum(budgets) == total and all(low <= n <= high for n in budgets)
        best = max(objective(probs, a, name) for a in allocations(count, total, low, high))
        assert objective(probs, budgets, name) == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize("name", rb.OBJECTIVES)
def test_allocation_matches_the_dynamic_program_on_larger_cases(name):
    rng = random.Random(2)
    for _ in range(40):
        count = rng.randint(5, 12)
        low = rng.randint(1, 3)
        high = rng.randint(max(low, 4), 24)
        total = rng.randint(count * low, count * high)
        probs = [random_p(rng) for _ in range(count)]
        budgets = rb.allocate_budgets(probs, total, low, high, name)
        assert sum(budgets) == total and all(low <= n <= high for n in budgets)
        assert objective(probs, budgets, name) == pytest.approx(
            dp_optimum(probs, total, low, high, name), abs=1e-12
        )


@pytest.mark.parametrize("name", rb.OBJECTIVES)
@pytest.mark.parametrize("p", [*SPECIAL_P, 0.3, 0.7, 0.123456789])
def test_equal_estimates_give_a_uniform_batch(p, name):
    for count, group in itertools.product([1, 2, 3, 7, 16], [2, 4, 8, 16]):
        for low, high in [(1, group), (2, 2 * group), (group, group), (1, 64)]:
            if low > group:
                continue
            assert rb.allocate_budgets([p] * count, count * group, low, high, name) == [group] * count


def test_equal_or_zero_gains_are_spread_as_evenly_as_possible():
    assert rb.allocate_budgets([0.5, 0.5, 0.5], 10, 1, 10) == [4, 3, 3]
    assert rb.allocate_budgets([0.0, 1.0, 0.0, 1.0], 10, 1, 5) == [3, 3, 2, 2]  # every gain is zero
    assert rb.allocate_budgets([1.0] * 5, 17, 2, 32) == [4, 4, 3, 3, 3]
    assert rb.allocate_budgets([1e-17] * 3, 10, 1, 9) == [4, 3, 3]  # 1 - p == 1.0 in float: gains flat in n
    # zero-gain prompts only get what the others cannot take (their high)
    assert rb.allocate_budgets([0.0, 0.5, 1.0], 12, 2, 6) == [3, 6, 3]


def test_the_ordering_the_formula_gives():
    # ample budget: the hard prompt overtakes p = 0.5 (whose gain 0.125 * 0.5^n halves per unit), the easy one
    # (InfoGain(0.95) = 0.002375) keeps the minimum
    assert rb.allocate_budgets([0.05, 0.5, 0.95], 24, 1, 32) == [16, 7, 1]
    # tight budget: p = 0.5 comes first, the hard prompt still beats the easy one
    assert rb.allocate_budgets([0.05, 0.5, 0.95], 12, 1, 32) == [4, 7, 1]
    # a batch of 7 prompts at 8 each: p = 0.1 gets the most; p = 0.02 (InfoGain 0.0192) and p >= 0.9 the minimum;
    # p = 0.7 a little more than p = 0.5
    probs = [0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98]
    budgets = rb.allocate_budgets(probs, 7 * 8, 2, 32)
    assert budgets == [2, 22, 11, 8, 9, 2, 2]
    assert objective(probs, budgets) == pytest.approx(dp_optimum(probs, 56, 2, 32), abs=1e-12)
    assert objective(probs, budgets) > objective(probs, [8] * 7)


def test_the_signal_objective_favours_rare_outcomes_and_is_symmetric():
    """Without InfoGain's weight, p and 1 - p are worth the same; a rare outcome (p = 0.1 or 0.9) needs the most
    completions to show, a near-certain one (p = 0.02) gains too little per completion, p = 0.5 shows at once."""
    probs = [0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98]
    budgets = rb.allocate_budgets(probs, 7 * 8, 2, 32, "signal")
    assert budgets == [2, 15, 8, 6, 8, 15, 2]
    assert objective(probs, budgets, "signal") > objective(probs, [8] * 7, "signal")
    with pytest.raises(ValueError, match="objective must be one of"):
        rb.allocate_budgets(probs, 56, 2, 32, "other")


def test_allocation_bounds_and_inputs():
    assert rb.allocate_budgets([], 0, 1, 4) == []
    assert rb.allocate_budgets([0.2, 0.9], 8, 4, 4) == [4, 4]  # low == high
    assert rb.allocate_budgets(torch.tensor([0.5, 0.5]), 6, 1, 8) == [3, 3]  # a 1-D tensor of estimates
    assert rb.allocate_budgets([0.5, 0.1], 64, 1, 32) == [32, 32]  # everything at high


@pytest.mark.parametrize(
    ("success", "total", "low", "high", "match"),
    [
        ([0.5, 0.5], 3, 2, 8, "below"),  # len * low > total
        ([0.5, 0.5], 17, 2, 8, "above"),  # len * high < total
        ([0.5], 4, 0, 8, "low"),
        ([0.5], 4, 4, 3, "high"),
        ([0.5, -0.1], 8, 1, 8, r"success\[1\]"),
        ([1.1], 4, 1, 8, "success"),
        ([math.nan], 4, 1, 8, "success"),
        ([0.5], 2.5, 1, 8, "total"),
        ([0.5], 4, 1.5, 8, "low"),
        ([], 1, 1, 8, "above"),
    ],
)
def test_allocation_rejects_bad_inputs(success, total, low, high, match):
    with pytest.raises(ValueError, match=match):
        rb.allocate_budgets(success, total, low, high)


# --- success estimates -------------------------------------------------------------------------------------


def test_success_estimates_match_the_beta_posterior_mean():
    rng = random.Random(3)
    for _ in range(200):
        count = rng.randint(0, 6)
        trials = [float(rng.choice([0, rng.randint(1, 16)])) for _ in range(count)]
        successes = [
            rng.uniform(0, n) if rng.random() < 0.5 else float(rng.randint(0, int(n))) for n in trials
        ]
        mean, strength = rng.random(), rng.choice([0.0, 0.5, 1.0, 4.0])
        got = rb.success_estimates(successes, trials, mean, strength)
        want = [
            mean if n == 0 else (s + strength * mean) / (n + strength)
            for s, n in zip(successes, trials, strict=True)
        ]
        assert got == pytest.approx(want, abs=1e-15)
        if 0 < mean < 1 and strength > 0:  # the prior keeps every estimate away from 0 and 1
            assert all(0 < p < 1 for p in got)


def test_success_estimates_edge_cases():
    assert rb.success_estimates([0, 3, 0], [0, 4, 4], 0.5, 2.0) == [0.5, (3 + 1) / 6, 1 / 6]
    assert rb.success_estimates([2, 0], [4, 0], 0.25, 0.0) == [0.5, 0.25]  # k = 0: the plain rate; unseen: m
    assert rb.success_estimates([], [], 0.5, 1.0) == []


@pytest.mark.parametrize(
    ("successes", "trials", "mean", "strength"),
    [
        ([1], [1, 2], 0.5, 1.0),  # lengths differ
        ([3], [2], 0.5, 1.0),  # s > n
        ([-1], [2], 0.5, 1.0),
        ([0], [-1], 0.5, 1.0),
        ([math.nan], [2], 0.5, 1.0),
        ([1], [math.inf], 0.5, 1.0),
        ([1], [2], 1.5, 1.0),
        ([1], [2], math.nan, 1.0),
        ([1], [2], 0.5, -1.0),
        ([1], [2], 0.5, math.nan),
    ],
)
def test_success_estimates_reject_bad_inputs(successes, trials, mean, strength):
    with pytest.raises(ValueError):
        rb.success_estimates(successes, trials, mean, strength)


def naive_outcomes(rewards: list[float], sizes: list[int], threshold: float) -> list[tuple[int, int]]:
    """Walk the rows one at a time, moving to the next group when the current one is full."""
    group, left = 0, list(sizes)
    counts = [[0, 0] for _ in sizes]
    for reward in rewards:
        while left[group] == 0:
            group += 1
        left[group] -= 1
        if reward == reward:  # not NaN
            counts[group][1] += 1
            counts[group][0] += reward >= threshold
    return [tuple(c) for c in counts]


def test_group_outcomes_match_a_row_by_row_count_on_random_inputs():
    """Random ragged groups (empty ones included), rewards on a coarse grid so that many equal the threshold, NaNs."""
    rng = random.Random(0)
    for _ in range(1000):
        sizes = [rng.randint(0, 6) for _ in range(rng.randint(1, 6))]
        grid = [-1.0, 0.0, 0.25, 0.5, 1.0, 1.25, 1.5, math.nan]
        rewards = [rng.choice(grid) for _ in range(sum(sizes))]
        threshold = rng.choice([-1.0, 0.0, 0.5, 1.0, 1.5, 2.0, rng.uniform(-2, 2)])
        assert rb.group_outcomes(rewards, sizes, threshold) == naive_outcomes(rewards, sizes, threshold)
        assert rb.group_outcomes(torch.tensor(rewards), sizes, threshold) == naive_outcomes(
            rewards, sizes, threshold
        )


def test_a_completions_class_depends_on_its_own_reward_only():
    """The two bug cases of a threshold read from the rewards seen: an all-right batch (every reward 1.0) is all solved;
    correctness + 0.5 x step credit is solved exactly when right, whatever else the batch holds."""
    assert rb.group_outcomes([1.0] * 8, [4, 4], 1.0) == [(4, 4), (4, 4)]
    assert rb.group_outcomes([0.0] * 8, [4, 4], 1.0) == [(0, 4), (0, 4)]
    steps = [0.0, 0.25, 0.5, 0.75, 1.0]
    right = [1.0 + 0.5 * s for s in steps]
    wrong = [0.5 * s for s in steps]
    assert rb.group_outcomes(wrong, [5], 1.0) == [(0, 5)]  # only wrong answers so far, credit up to 0.5
    assert rb.group_outcomes(right + wrong, [5, 5], 1.0) == [(5, 5), (0, 5)]


@pytest.mark.parametrize(
    ("rewards", "sizes", "threshold", "match"),
    [
        ([1.0, 0.0], [1], 1.0, "do not split 2 rewards"),
        ([1.0, 0.0], [3, -1], 1.0, "do not split"),
        ([1.0], [1], math.nan, "finite"),
        ([1.0], [1], math.inf, "finite"),
    ],
)
def test_group_outcomes_reject_bad_inputs(rewards, sizes, threshold, match):
    with pytest.raises(ValueError, match=match):
        rb.group_outcomes(rewards, sizes, threshold)


def test_succession_rate_is_the_uniform_prior_posterior_mean_and_never_0_or_1():
    assert rb.succession_rate(0, 0) == 0.5
    assert rb.succession_rate(8, 8) == 9 / 10 and rb.succession_rate(0, 8) == 1 / 10
    rng = random.Random(1)
    for _ in range(1000):
        trials = rng.choice([0, 1, 4, 8, rng.randint(0, 10**6)])
        successes = rng.choice([0, trials, rng.randint(0, trials)])
        rate = rb.succession_rate(successes, trials)
        assert 0.0 < rate < 1.0 and rate == pytest.approx((successes + 1) / (trials + 2))
        # the estimates built on it stay inside (0, 1) too, for prompts never, always and sometimes solved
        seen = [0, trials, successes]
        for p in rb.success_estimates(seen, [trials] * 3, rate, 2.0):
            assert 0.0 < p < 1.0
    for successes, trials in [(-1, 4), (5, 4), (math.nan, 4), (0, math.inf)]:
        with pytest.raises(ValueError, match="successes <= trials"):
            rb.succession_rate(successes, trials)
