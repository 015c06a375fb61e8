"""grpo_hub.generation.is_diagnostics: the vllm_is/* metrics of one generation batch, summed over ranks, against a
naive pass over every rank's IS units."""

import math
import random
from collections import defaultdict

import pytest
import torch

from grpo_hub.algos import importance
from grpo_hub.generation.is_diagnostics import append_is_diagnostics, local_is_sums


def random_rank(rng):
    rows, steps = rng.randint(1, 4), rng.randint(1, 6)
    trainer = torch.tensor(
        [[rng.uniform(-6, 0) for _ in range(steps)] for _ in range(rows)], dtype=torch.float64
    )
    sampler = trainer + torch.tensor([[rng.gauss(0, 0.6) for _ in range(steps)] for _ in range(rows)])
    mask = torch.tensor([[rng.random() < 0.8 for _ in range(steps)] for _ in range(rows)])
    return trainer, sampler, mask


def naive_units(trainer, sampler, mask, level):
    """Every IS unit's raw weight: a token's exp(Δ), or a sequence's exp(ΣΔ) over its masked-in tokens."""
    weights = []
    for t_row, s_row, m_row in zip(trainer.tolist(), sampler.tolist(), mask.tolist(), strict=True):
        deltas = [t - s for t, s, m in zip(t_row, s_row, m_row, strict=True) if m]
        if level == "token":
            weights += [math.exp(d) for d in deltas]
        elif deltas:
            weights.append(math.exp(sum(deltas)))
    return weights


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_ess_and_truncated_share_pool_every_ranks_units(level):
    rng = random.Random(3)
    ranks = [random_rank(rng) for _ in range(3)]
    low, high = 0.5, 2.0
    sums = [local_is_sums(*rank, level=level, pooling="sum", low=low, high=high) for rank in ranks]
    metrics = defaultdict(list)
    append_is_diagnostics(torch.stack(sums), metrics, "truncate")
    units = [w for rank in ranks for w in naive_units(*rank, level)]
    assert metrics["vllm_is/ess"] == [pytest.approx(importance.effective_sample_size(torch.tensor(units)))]
    outside = sum(w < low or w > high for w in units) / len(units)
    assert metrics["vllm_is/frac_truncated"] == [pytest.approx(outside)]
    assert 0 < metrics["vllm_is/ess"][0] < 1  # a real mismatch reweights


def test_no_mismatch_is_full_sample_size():
    trainer = torch.full((2, 3), -1.0)
    sums = local_is_sums(
        trainer, trainer.clone(), torch.ones(2, 3), level="token", pooling="sum", low=None, high=2.0
    )
    metrics = defaultdict(list)
    append_is_diagnostics(sums.unsqueeze(0), metrics, "truncate")
    assert metrics["vllm_is/ess"] == [pytest.approx(1.0)] and metrics["vllm_is/kl_k3"] == [0.0]
