"""Per-prompt rollout budgets (Knapsack RL). Pure Python (math, heapq): imports neither trl nor transformers.

Knapsack RL, Li et al. 2025, "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation",
arXiv:2509.25849. A prompt with success probability p whose group gets N completions (binary rewards) is an
item whose value is
  Value(p, N)       = P_nonzero(p, N) * InfoGain(p)
  P_nonzero(p, N)   = 1 - p^N - (1-p)^N      (the group holds a success and a failure: GRPO's gradient is non-zero)
  InfoGain(p)      ~= p (1-p)^2              (the paper's approximation of the expected increase of the success
                                              probability after one update)
and the batch's N_i maximise sum_i Value(p_i, N_i) subject to sum_i N_i = total, low <= N_i <= high.

Source of InfoGain: the approximation p(1-p)^2 is the one the paper uses for its task value, as a summary of the
paper and a public implementation of its solver both state (the implementation's value table is
(1 - p^N - (1-p)^N) * p * (1-p)^2). The paper's own derivation of the exact InfoGain could not be read here, so
only the approximation is implemented.

Solver: the paper solves the knapsack by dynamic programming. Here the objective is separable and, for each prompt,
concave in N: the marginal gain
  Delta(p, N) = Value(p, N+1) - Value(p, N) = InfoGain(p) * (p^N (1-p) + (1-p)^N p)
is non-increasing in N (Delta(p, N) - Delta(p, N+1) = InfoGain(p) * (p^N (1-p)^2 + (1-p)^N p^2) >= 0). Greedy
marginal allocation -- every prompt starts at `low`, each further unit goes to the prompt with the largest
Delta -- is then exactly optimal (Gross 1956; Fox 1966, "Discrete optimization via marginal analysis"), in
O((total - len * low) log len) with a heap instead of the DP's O(len * total * high).

Outcomes: Knapsack RL's p is a pass rate under binary rewards. A completion counts as solved when its reward reaches a
fixed threshold (`group_outcomes`): its class depends on its own reward only, never on the other rewards seen, so the
history counts alike from the first batch on (an all-right first batch is all solved) however the range of rewards
grows, and a reward of correctness (0 or 1) plus partial credit below 1 (0.5 x a step share) is solved exactly when
the answer is right at a threshold of 1.

Estimates of p come from `success_estimates` (the posterior mean of a Beta prior) centred on `succession_rate` (a
rate under a uniform prior, strictly inside (0, 1)): with a prior mean strictly inside (0, 1) and a positive prior
strength no estimate is exactly 0 or 1, so no prompt's value is identically zero.

Objectives (`OBJECTIVES`): "knapsack" is the value above; "signal" drops the InfoGain weight and maximises the
expected number of groups with both outcomes, sum_i P_nonzero(p_i, N_i): Knapsack RL's "effective gradient ratio"
itself, and the goal Reinforce-Ada (Xiong et al., 2025, arXiv:2510.04996) samples towards, in rounds, until a
prompt has both a right and a wrong answer. Its marginal gain p^N (1-p) + (1-p)^N p is non-increasing too, so the same
greedy is exact for it.

What the value favours: InfoGain peaks at p = 1/3, so budgets go to hard-but-not-hopeless prompts. For
p = (0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98), total = 7 * 8, low = 2, high = 32 the optimum is
(2, 22, 11, 8, 9, 2, 2): p = 0.1 gets the most, while p = 0.02 (InfoGain 0.0192) gets only `low`, like p >= 0.9.
"signal" is symmetric in p and 1 - p and gives a rare outcome the most: (2, 15, 8, 6, 8, 15, 2) there.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence


def _check_probability(name: str, p: float) -> float:
    p = float(p)
    if math.isnan(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
    return p


def _check_count(name: str, n: int, minimum: int) -> int:
    if isinstance(n, bool) or int(n) != n or n < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {n!r}")
    return int(n)


def info_gain(p: float) -> float:
    """InfoGain(p) = p (1-p)^2, Knapsack RL's approximation of the expected increase of the success probability
    after one policy update (arXiv:2509.25849). Zero at p = 0 and p = 1, largest (4/27) at p = 1/3."""
    p = _check_probability("p", p)
    return p * (1.0 - p) ** 2


def nonzero_gradient_probability(p: float, n: int) -> float:
    """P_nonzero(p, n) = 1 - p^n - (1-p)^n: the probability that n independent Bernoulli(p) outcomes hold both a
    success and a failure, i.e. that a GRPO group of n binary rewards has a non-zero advantage (Knapsack RL,
    arXiv:2509.25849). 0 for n <= 1 and for p in {0, 1}.

    Computed as -expm1(n log1p(-r)) - r^n with r = min(p, 1-p) (so (1-r)^n = max(p, 1-p)^n; 1 - p is exact for
    p >= 1/2), which keeps a small r from cancelling to 0; clamped to [0, 1] against rounding."""
    p = _check_probability("p", p)
    n = _check_count("n", n, 0)
    if n <= 1:
        return 0.0
    small = min(p, 1.0 - p)
    value = -math.expm1(n * math.log1p(-small)) - small**n
    return min(max(value, 0.0), 1.0)


def budget_value(p: float, n: int) -> float:
    """Value(p, n) = P_nonzero(p, n) * InfoGain(p) = (1 - p^n - (1-p)^n) * p (1-p)^2: Knapsack RL's value of giving
    a prompt of success probability p a group of n completions (arXiv:2509.25849)."""
    return nonzero_gradient_probability(p, n) * info_gain(p)


def _no_weight(p: float) -> float:
    """The "signal" objective's weight: every group with both outcomes counts the same."""
    return 1.0


OBJECTIVES = {"knapsack": info_gain, "signal": _no_weight}  # objective -> weight of P_nonzero


def marginal_gain(p: float, n: int, objective: str = "knapsack") -> float:
    """Delta(p, n) = Value(p, n+1) - Value(p, n) = weight(p) * (p^n (1-p) + (1-p)^n p) for n >= 1 (closed form,
    no cancellation), weight = `OBJECTIVES[objective]`; non-increasing in n, so the value is concave in n and
    greedy allocation is optimal."""
    p = _check_probability("p", p)
    n = _check_count("n", n, 1)
    q = 1.0 - p
    return OBJECTIVES[objective](p) * (p**n * q + q**n * p)


def allocate_budgets(
    success: Sequence[float], total: int, low: int, high: int, objective: str = "knapsack"
) -> list[int]:
    """The N_i maximising sum_i weight(p_i) P_nonzero(p_i, N_i) (weight: `OBJECTIVES[objective]`; "knapsack" is
    Value) s.t. sum_i N_i = total, low <= N_i <= high (Knapsack RL,
    arXiv:2509.25849), by greedy marginal allocation (Gross 1956 / Fox 1966), exact for this separable concave
    objective: every prompt starts at `low`; each of the total - len * low remaining units goes to the prompt
    below `high` with the largest Delta(p_i, N_i) (see `marginal_gain`).

    Ties are decided deterministically: gains are compared exactly (floats; equal estimates give bit-identical
    gains, and any order among truly equal gains is optimal), then the prompt with the fewest units so far, then
    the lowest index. The fewest-units rule makes equal estimates -- and prompts whose gains are all zero (p in
    {0, 1}) or flat in float -- share units evenly: total // len each and one more to the lowest indices, so
    total = len * G with equal estimates gives every prompt exactly G (a uniform batch).

    `success`: the estimates p_i in [0, 1] (any sequence of numbers, a 1-D tensor included). Raises ValueError
    when low < 1, high < low, len * low > total, len * high < total, or an estimate is NaN or outside [0, 1].
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {tuple(OBJECTIVES)}, got {objective!r}")
    probs = [_check_probability(f"success[{i}]", p) for i, p in enumerate(success)]
    low = _check_count("low", low, 1)
    high = _check_count("high", high, low)
    total = _check_count("total", total, 0)
    count = len(probs)
    if count * low > total:
        raise ValueError(f"total={total} is below {count} prompts x low={low} = {count * low}")
    if count * high < total:
        raise ValueError(f"total={total} is above {count} prompts x high={high} = {count * high}")
    budgets = [low] * count
    # heap entries (-gain, units so far, index): the smallest is the largest gain, then fewest units, then lowest index
    heap = [(-marginal_gain(p, low, objective), low, i) for i, p in enumerate(probs) if low < high]
    heapq.heapify(heap)
    for _ in range(total - count * low):
        _, units, i = heapq.heappop(heap)
        units += 1
        budgets[i] = units
        if units < high:
            heapq.heappush(heap, (-marginal_gain(probs[i], units, objective), units, i))
    return budgets


def success_estimates(
    successes: Sequence[float], trials: Sequence[float], prior_mean: float, prior_strength: float
) -> list[float]:
    """Posterior mean of each prompt's success probability under a Beta prior of mean m = `prior_mean` and
    pseudo-count k = `prior_strength` (Beta(k m, k (1-m))): p_i = (s_i + k m) / (n_i + k); a prompt never tried
    (n_i = 0) gets m (also when k = 0, where the others get the plain rate s_i / n_i).

    `successes` s_i (may be fractional: summed rewards in [0, 1]) and `trials` n_i: per prompt, 0 <= s_i <= n_i.
    Raises ValueError on different lengths, NaN or infinite counts, s_i outside [0, n_i], m outside [0, 1] or k < 0.
    """
    prior_mean = _check_probability("prior_mean", prior_mean)
    prior_strength = float(prior_strength)
    if not math.isfinite(prior_strength) or prior_strength < 0:
        raise ValueError(f"prior_strength must be a finite number >= 0, got {prior_strength!r}")
    if len(successes) != len(trials):
        raise ValueError(f"successes ({len(successes)}) and trials ({len(trials)}) differ in length")
    out = []
    for i, (s, n) in enumerate(zip(successes, trials, strict=True)):
        s, n = float(s), float(n)
        if not (math.isfinite(s) and math.isfinite(n)) or n < 0 or not 0.0 <= s <= n:
            raise ValueError(f"prompt {i}: need finite 0 <= successes <= trials, got {s!r} of {n!r}")
        out.append(prior_mean if n == 0 else (s + prior_strength * prior_mean) / (n + prior_strength))
    return out


def group_outcomes(rewards: Sequence[float], sizes: Sequence[int], threshold: float) -> list[tuple[int, int]]:
    """(solved, scored) of each group of `sizes` consecutive `rewards` (a 1-D tensor or any sequence of numbers):
    scored counts its rewards that are not NaN (an unscorable completion counts for nothing), solved those at least
    `threshold`. Knapsack RL (arXiv:2509.25849) and Reinforce-Ada (arXiv:2510.04996) count a completion as a success
    when its binary reward is 1; a fixed threshold extends that to any reward without looking at the others.
    Raises ValueError when the sizes do not sum to the number of rewards or a size is negative, or when the
    threshold is not finite."""
    rewards = [float(r) for r in rewards]
    threshold = float(threshold)
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite number, got {threshold!r}")
    if any(size < 0 for size in sizes) or sum(sizes) != len(rewards):
        raise ValueError(f"group sizes {list(sizes)} do not split {len(rewards)} rewards")
    outcomes, start = [], 0
    for size in sizes:
        group = [r for r in rewards[start : start + size] if not math.isnan(r)]
        outcomes.append((sum(r >= threshold for r in group), len(group)))
        start += size
    return outcomes


def succession_rate(successes: float, trials: float) -> float:
    """(s + 1) / (n + 2): the posterior mean of a success rate under a uniform Beta(1, 1) prior (Laplace's rule of
    succession). 1/2 with no trials, and strictly inside (0, 1) for any 0 <= s <= n, where the plain rate s / n is 0
    or 1 after a run of one outcome. Raises ValueError unless 0 <= s <= n and both are finite."""
    s, n = float(successes), float(trials)
    if not (math.isfinite(s) and math.isfinite(n)) or not 0.0 <= s <= n:
        raise ValueError(f"need finite 0 <= successes <= trials, got {s!r} of {n!r}")
    return (s + 1.0) / (n + 2.0)
