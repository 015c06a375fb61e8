"""micro_batch_denominator against a naive reference written from the cases of TRL 1.16 and the filtering docs."""

import random

import pytest
import torch

from grpo_hub.algos.loss_denominator import micro_batch_denominator
from grpo_hub.algos.loss_types import BATCH_TOKENS, DENOMINATORS, MICRO_TOKENS, ROWS


def naive_denominator(kind, train, ga, procs, spg, micro_rows, micro_tokens, batch_tokens, filtering, counts):
    """Per case, in plain floats: the denominator of one micro-batch's summed loss terms."""
    kept_rows, all_rows, all_tokens = counts
    accumulation = ga if train else 1
    if kind == ROWS:
        if filtering is None:
            return float(micro_rows) * accumulation
        rows = kept_rows if filtering == "kept" else all_rows
        # rows of the generation batch spread over S micro-steps on P ranks
        per_micro_step = rows / spg / procs
        return max(per_micro_step, 1e-8) * accumulation
    if kind == MICRO_TOKENS:
        return max(float(micro_tokens), 1.0) * accumulation
    tokens = all_tokens if filtering == "all" else batch_tokens
    tokens = max(float(tokens), 1.0)
    if not train:
        return tokens / procs
    return tokens / procs / spg * accumulation  # one micro-step's share, summed over A micro-steps


def random_case(rng):
    spg, procs = rng.randint(1, 6), rng.randint(1, 4)
    all_rows = rng.randint(1, 8) * spg * procs
    kept_rows = rng.randint(0, all_rows)
    all_tokens = all_rows * rng.randint(1, 40)
    batch_tokens = rng.randint(0, all_tokens)
    return dict(
        kind=rng.choice(DENOMINATORS),
        train=rng.random() < 0.7,
        ga=rng.randint(1, 8),
        procs=procs,
        spg=spg,
        micro_rows=rng.randint(1, 16),
        micro_tokens=rng.randint(0, 300),
        batch_tokens=batch_tokens,
        filtering=rng.choice([None, "kept", "all"]),
        counts=(kept_rows, all_rows, all_tokens),
    )


def call(case, as_tensors):
    wrap = (lambda x: torch.tensor(x)) if as_tensors else (lambda x: x)
    kept_rows, all_rows, all_tokens = case["counts"]
    return micro_batch_denominator(
        case["kind"],
        train=case["train"],
        accumulation_steps=case["ga"],
        num_processes=case["procs"],
        steps_per_generation=case["spg"],
        micro_rows=wrap(case["micro_rows"]),
        micro_tokens=wrap(case["micro_tokens"]),
        batch_tokens=wrap(case["batch_tokens"]),
        filtering=case["filtering"],
        kept_rows=wrap(float(kept_rows)),
        all_rows=wrap(float(all_rows)),
        all_tokens=wrap(all_tokens),
    )


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("as_tensors", [False, True])
def test_matches_naive_on_random_inputs(seed, as_tensors):
    rng = random.Random(seed)
    for _ in range(200):
        case = random_case(rng)
        got = call(case, as_tensors)
        assert got.dim() == 0
        assert got.item() == pytest.approx(naive_denominator(**case), rel=1e-6), case


@pytest.mark.parametrize("filtering", [None, "kept", "all"])
def test_edge_cases_stay_finite_and_positive(filtering):
    # nothing kept, no loss tokens anywhere: the denominator stays >= a positive floor
    for kind in DENOMINATORS:
        value = micro_batch_denominator(
            kind,
            train=True,
            accumulation_steps=1,
            micro_rows=1,
            micro_tokens=0,
            batch_tokens=0,
            filtering=filtering,
            kept_rows=0.0,
            all_rows=0.0,
            all_tokens=0,
        )
        assert torch.isfinite(value) and value > 0


def test_train_and_eval_differ_only_by_accumulation_and_split():
    common = dict(accumulation_steps=4, num_processes=2, steps_per_generation=8, batch_tokens=64)
    train = micro_batch_denominator(BATCH_TOKENS, train=True, **common)
    evaluation = micro_batch_denominator(BATCH_TOKENS, train=False, **common)
    assert train.item() == pytest.approx(64 / 2 * 4 / 8)
    assert evaluation.item() == pytest.approx(64 / 2)
    assert micro_batch_denominator(ROWS, train=False, accumulation_steps=4, micro_rows=3).item() == 3


def test_kept_and_all_choose_their_counts():
    common = dict(train=True, accumulation_steps=2, num_processes=1, steps_per_generation=2)
    counts = dict(kept_rows=4.0, all_rows=8.0, all_tokens=80, batch_tokens=30, micro_rows=5)
    assert micro_batch_denominator(ROWS, filtering="kept", **common, **counts).item() == 4.0  # 4/2 rows · 2
    assert micro_batch_denominator(ROWS, filtering="all", **common, **counts).item() == 8.0
    assert micro_batch_denominator(BATCH_TOKENS, filtering="kept", **common, **counts).item() == 30.0
    assert micro_batch_denominator(BATCH_TOKENS, filtering="all", **common, **counts).item() == 80.0


def test_rejects_unknown_cases():
    with pytest.raises(ValueError, match="kind"):
        micro_batch_denominator("tokens", train=True, accumulation_steps=1)
    with pytest.raises(ValueError, match="filtering"):
        micro_batch_denominator(ROWS, train=True, accumulation_steps=1, micro_rows=1, filtering="some")
