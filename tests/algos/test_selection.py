"""GRESO selective rollout (grpo_hub.algos.selection) against naive per-group loops, random inputs and edge cases."""

import math
import random

import pytest
import torch

from grpo_hub.algos import advantages as adv
from grpo_hub.algos import selection
from grpo_hub.algos.advantages import ALL_MAX, ALL_MIN, INFORMATIVE
from grpo_hub.algos.selection import OutcomeHistory


def naive_kind(values: list[float], eps: float, low: float, high: float) -> int:
    valid = [v for v in values if not math.isnan(v)]
    if not valid:
        return INFORMATIVE
    if len(valid) >= 2 and max(valid) - min(valid) > eps:
        return INFORMATIVE
    value = sum(valid) / len(valid)
    return ALL_MAX if value - low >= high - value else ALL_MIN


@pytest.mark.parametrize("seed", range(20))
def test_kinds_match_a_naive_loop(seed):
    rng = random.Random(seed)
    group_size, groups = rng.choice([2, 3, 4]), rng.randint(1, 12)
    low, high = rng.choice([(0.0, 1.0), (-5.0, 10.0)])
    values = []
    for _ in range(groups):
        kind = rng.choice(["flat", "flat_low", "flat_high", "mixed", "nan", "one_nan"])
        flat = {"flat": rng.uniform(low, high), "flat_low": low, "flat_high": high}.get(kind, 0.0)
        group = (
            [flat] * group_size
            if kind.startswith("flat")
            else [rng.uniform(low, high) for _ in range(group_size)]
        )
        if kind == "nan":
            group = [math.nan] * group_size
        if kind == "one_nan":
            group = [math.nan] + [high] * (group_size - 1)
        values += group
    eps = rng.choice([0.0, 1e-3])
    got = adv.zero_signal_kinds(torch.tensor(values), group_size, eps, low, high)
    want = [naive_kind(values[i : i + group_size], eps, low, high) for i in range(0, len(values), group_size)]
    assert got.tolist() == want


def test_kinds_edge_cases():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.0, 1.0])
    assert adv.zero_signal_kinds(rewards, 2, 0.0, 0.0, 1.0).tolist() == [
        ALL_MAX,
        ALL_MIN,
        ALL_MAX,
        INFORMATIVE,
    ]
    # float noise within eps is still flat; a bound range of one value classifies everything as all-max
    noisy = torch.tensor([3.0, 3.0 + 1e-7])
    assert adv.zero_signal_kinds(noisy, 2, 1e-6, 3.0, 3.0).tolist() == [ALL_MAX]


def naive_skip_probability(
    kind: int, streak: int, explore: dict, min_keep: float, skips: int = 0, revisit_after: int | None = None
) -> float:
    if kind == INFORMATIVE or streak == 0:
        return 0.0
    if revisit_after is not None and skips >= revisit_after * streak:
        return 0.0  # waited its bound: generate it
    return 1.0 - max(explore[kind] ** streak, min_keep)


@pytest.mark.parametrize("seed", range(10))
def test_skip_probabilities_match_greso_formula(seed):
    rng = random.Random(seed)
    kinds = [rng.choice([INFORMATIVE, ALL_MAX, ALL_MIN]) for _ in range(30)]
    streaks = [0 if k == INFORMATIVE else rng.randint(0, 12) for k in kinds]
    explore = {ALL_MAX: rng.uniform(0.05, 0.95), ALL_MIN: rng.uniform(0.05, 0.95)}
    min_keep = rng.choice([0.01, 0.2, 1.0])
    got = selection.skip_probabilities(torch.tensor(kinds), torch.tensor(streaks), explore, min_keep)
    want = [naive_skip_probability(k, z, explore, min_keep) for k, z in zip(kinds, streaks, strict=True)]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))
    assert bool(
        (got <= 1.0 - min_keep + 1e-12).all()
    )  # the floor: every prompt keeps a chance to be revisited


@pytest.mark.parametrize("seed", range(10))
def test_bounded_revisit_matches_a_naive_rule(seed):
    rng = random.Random(seed)
    kinds = [rng.choice([INFORMATIVE, ALL_MAX, ALL_MIN]) for _ in range(40)]
    streaks = [0 if k == INFORMATIVE else rng.randint(0, 4) for k in kinds]
    skips = [rng.randint(0, 9) for _ in kinds]
    explore = {ALL_MAX: rng.uniform(0.05, 0.95), ALL_MIN: rng.uniform(0.05, 0.95)}
    revisit_after = rng.choice([1, 2, 3])
    got = selection.skip_probabilities(
        torch.tensor(kinds), torch.tensor(streaks), explore, 0.01, torch.tensor(skips), revisit_after
    )
    want = [
        naive_skip_probability(k, z, explore, 0.01, s, revisit_after)
        for k, z, s in zip(kinds, streaks, skips, strict=True)
    ]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))
    assert any(w == 0 and k != INFORMATIVE and z > 0 for w, k, z in zip(want, kinds, streaks, strict=True))


def test_exploration_moves_toward_the_target_and_stays_in_bounds():
    assert selection.adapt_exploration(0.5, kind_frac=0.3, target=0.25, step=0.01) == pytest.approx(0.49)
    assert selection.adapt_exploration(0.5, kind_frac=0.25, target=0.25, step=0.01) == pytest.approx(0.49)
    assert selection.adapt_exploration(0.5, kind_frac=0.1, target=0.25, step=0.01) == pytest.approx(0.51)
    assert selection.adapt_exploration(0.05, 1.0, 0.25, 0.01) == selection.EXPLORE_LOW
    assert selection.adapt_exploration(0.95, 0.0, 0.25, 0.01) == selection.EXPLORE_HIGH


def test_history_runs_revisits_and_state_round_trip():
    history = OutcomeHistory()
    assert history.record([1, 2, 3], [ALL_MAX, ALL_MIN, INFORMATIVE]) == (0, 0)
    history.record([1, 2], [ALL_MAX, ALL_MAX])  # 1: run of 2 all-max; 2: kind changed, run restarts at 1
    kinds, streaks, skips = history.lookup([1, 2, 3, 99])
    assert kinds.tolist() == [ALL_MAX, ALL_MAX, INFORMATIVE, INFORMATIVE]
    assert streaks.tolist() == [2, 1, 0, 0] and skips.tolist() == [0, 0, 0, 0]
    history.mark_skipped([1, 2])
    history.mark_skipped([1])
    assert history.lookup([1, 2, 3])[2].tolist() == [2, 1, 0]  # skips since the last scoring
    copy = OutcomeHistory()
    copy.load_state_dict(history.state_dict())
    for h in (history, copy):
        assert h.record([1, 2, 3], [INFORMATIVE, ALL_MAX, ALL_MIN]) == (
            2,
            1,
        )  # 1 turned informative: an error
        assert h.lookup([1, 2, 3])[1].tolist() == [0, 2, 1]
        assert h.lookup([1, 2, 3])[2].tolist() == [0, 0, 0]  # scoring resets the skip count
        assert h.record([1], [ALL_MIN]) == (0, 0)  # revisit counted once
    assert copy.state_dict().keys() == history.state_dict().keys()
    for key, value in history.state_dict().items():
        assert torch.equal(value, copy.state_dict()[key]), key


@pytest.mark.parametrize("seed", range(5))
def test_history_matches_a_naive_replay(seed):
    rng = random.Random(seed)
    history, log = OutcomeHistory(), {}
    for _ in range(40):
        ids = rng.sample(range(8), 4)
        kinds = [rng.choice([INFORMATIVE, ALL_MAX, ALL_MIN]) for _ in ids]
        history.record(ids, kinds)
        for i, k in zip(ids, kinds, strict=True):
            log.setdefault(i, []).append(k)
    for i, outcomes in log.items():
        last, run = outcomes[-1], 0
        for k in reversed(outcomes):
            if k != last or k == INFORMATIVE:
                break
            run += 1
        assert history.lookup([i])[0].item() == last and history.lookup([i])[1].item() == run
