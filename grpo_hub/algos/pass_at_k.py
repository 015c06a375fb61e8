"""Unbiased pass@k and the chance that a group of completions holds both outcomes. Pure Python (math only).

Given n samples of one problem of which c are right, a group of k completions drawn from them without replacement:

  pass@k            = 1 - C(n-c, k) / C(n, k)                       (at least one right completion)
  both outcomes, g  = 1 - C(c, g) / C(n, g) - C(n-c, g) / C(n, g)   (a right and a wrong one: GRPO's gradient is
                                                                     non-zero for a binary reward)

pass@k is the unbiased estimator of Chen et al. 2021, "Evaluating Large Language Models Trained on Code",
arXiv:2107.03374, section 2.1: averaged over problems it estimates the chance that k fresh samples hold a right
one. Its binomials overflow a float for n in the hundreds, so, as the paper's numpy snippet does, the ratio is
computed as a product,

  C(m, k) / C(n, k) = prod_{i=0}^{k-1} (m - i) / (n - i)      (0 when m < k),

which for m = n - c is the paper's 1 - prod_{i=n-c+1}^{n} (1 - k / i) written over the k factors instead of the c
ones. Both-outcomes is the same estimator for the event Knapsack RL (Li et al. 2025, arXiv:2509.25849) calls a
non-zero gradient, 1 - p^N - (1-p)^N, drawn from the n samples instead of from Bernoulli(p).
"""

from __future__ import annotations

__all__ = ["both_outcomes_in_group", "pass_at_k"]


def _check(n: int, c: int, k: int, k_name: str) -> None:
    for name, value in (("n", n), ("c", c), (k_name, k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an integer, got {value!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1 (samples drawn), got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}] (right samples), got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"{k_name} must be in [1, n={n}] (completions drawn from the samples), got {k}")


def _all_from(n: int, m: int, k: int) -> float:
    """C(m, k) / C(n, k): the chance that k of n items drawn without replacement all lie in a given m of them."""
    ratio = 1.0
    for i in range(k):
        if m - i <= 0:
            return 0.0
        ratio *= (m - i) / (n - i)
    return ratio


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c right: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, arXiv:2107.03374).

    1.0 when k > n - c (every k-subset holds a right sample), 0.0 when c = 0; pass@1 = c / n.
    """
    _check(n, c, k, "k")
    return 1.0 - _all_from(n, n - c, k)


def both_outcomes_in_group(n: int, c: int, g: int) -> float:
    """Chance that g completions drawn without replacement from n samples (c right) hold a right and a wrong one:
    1 - C(c, g) / C(n, g) - C(n-c, g) / C(n, g). 0.0 for g = 1, c = 0 or c = n; 1.0 when g exceeds both c and n - c.
    """
    _check(n, c, g, "g")
    return max(0.0, 1.0 - _all_from(n, c, g) - _all_from(n, n - c, g))
