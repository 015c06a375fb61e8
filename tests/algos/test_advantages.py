"""grpo_hub.algos.advantages against naive loop references, TRL 1.16's own formula, and edge cases."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_hub.algos import advantages as adv
from tests.algos import naive

SETTINGS = settings(max_examples=60, deadline=None)
reward_values = st.one_of(st.floats(-10, 10), st.just(math.nan), st.sampled_from([0.0, 1.0]))


@st.composite
def grouped_rewards(draw, nan=True):
    group_size = draw(st.integers(1, 6))
    n_groups = draw(st.integers(1, 4))
    values = reward_values if nan else st.floats(-10, 10)
    rewards = draw(st.lists(values, min_size=group_size * n_groups, max_size=group_size * n_groups))
    return rewards, group_size


@st.composite
def step_batch(draw):
    group_size = draw(st.integers(1, 4))
    rows = group_size * draw(st.integers(1, 3))
    steps = draw(st.integers(1, 6))
    rewards = [draw(st.lists(st.floats(-5, 5), min_size=steps, max_size=steps)) for _ in range(rows)]
    mask = [draw(st.lists(st.booleans(), min_size=steps, max_size=steps)) for _ in range(rows)]
    return rewards, mask, group_size


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


# --- group_advantages ----------------------------------------------------------------------------------


@SETTINGS
@given(grouped_rewards(), st.sampled_from(adv.NORMS), st.sampled_from(adv.STD_SCOPES))
def test_group_advantages_matches_naive(data, norm, std_scope):
    rewards, group_size = data
    got = adv.group_advantages(t64(rewards), group_size, norm=norm, std_scope=std_scope)
    expected = naive.group_advantages(rewards, group_size, norm, std_scope)
    torch.testing.assert_close(got, t64(expected), rtol=1e-9, atol=1e-9)


@SETTINGS
@given(grouped_rewards(), st.sampled_from(["mean_std", "mean_only"]))
def test_mean_baseline_advantages_sum_to_zero_per_group(data, norm):
    rewards, group_size = data
    got = adv.group_advantages(t64(rewards), group_size, norm=norm).reshape(-1, group_size)
    torch.testing.assert_close(
        got.sum(dim=1), torch.zeros(got.shape[0], dtype=torch.float64), atol=1e-6, rtol=0
    )


def trl_sum_then_normalize(rewards, num_generations, scale_rewards):
    """TRL 1.16 grpo_trainer.py lines 2765-2788 + nan_to_num at 2806, copied as written there."""
    from trl.trainer.utils import nanstd

    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        if num_generations > 1:
            std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
            std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
        else:
            std_rewards = torch.zeros_like(rewards)
    else:
        std_rewards = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


@SETTINGS
@given(grouped_rewards(), st.sampled_from(["group", "batch", "none"]))
def test_group_advantages_reproduce_trl_scale_rewards_bit_for_bit(data, scale_rewards):
    rewards, group_size = data
    rewards = torch.tensor(rewards, dtype=torch.float32)
    norm = "mean_only" if scale_rewards == "none" else "mean_std"
    std_scope = "batch" if scale_rewards == "batch" else "group"
    got = adv.group_advantages(rewards, group_size, norm=norm, std_scope=std_scope)
    assert torch.equal(got, trl_sum_then_normalize(rewards, group_size, scale_rewards))


def test_group_size_one_gives_zero_advantage():
    rewards = torch.tensor([3.0, -1.0, 7.0])
    for norm in ("mean_std", "mean_only"):
        for scope in adv.STD_SCOPES:
            assert torch.equal(adv.group_advantages(rewards, 1, norm=norm, std_scope=scope), torch.zeros(3))
    assert torch.equal(adv.group_advantages(rewards, 1, norm="no_baseline"), rewards)


def test_nan_rewards_are_excluded_and_get_zero():
    rewards = torch.tensor([1.0, math.nan, 0.0, 2.0, math.nan, math.nan, math.nan, math.nan])
    got = adv.group_advantages(rewards, 4)
    group = [1.0, 0.0, 2.0]  # mean 1, sample std 1
    expected = torch.tensor([0.0, 0.0, -1.0, 1.0]) / (1.0 + 1e-4)
    torch.testing.assert_close(got[[0, 2, 3]], expected[[0, 2, 3]])
    assert got[1] == 0 and torch.equal(got[4:], torch.zeros(4))
    assert naive.sample_std(group) == 1.0


def test_rejects_batch_not_divisible_by_group_size():
    with pytest.raises(ValueError, match="group_size"):
        adv.group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="norm"):
        adv.group_advantages(torch.zeros(4), 2, norm="z")


# --- zero_signal_mask ----------------------------------------------------------------------------------


@SETTINGS
@given(grouped_rewards(), st.sampled_from([0.0, 0.5]))
def test_zero_signal_rows_are_exactly_the_zero_spread_groups(data, eps):
    rewards, group_size = data
    got = adv.zero_signal_mask(t64(rewards), group_size, eps=eps)
    expected = []
    for start in range(0, len(rewards), group_size):
        valid = [x for x in rewards[start : start + group_size] if not math.isnan(x)]
        zero = len(valid) < 2 or max(valid) - min(valid) <= eps
        expected += [zero] * group_size
    assert got.tolist() == expected


# --- ragged groups (per-prompt rollout budgets) --------------------------------------------------------------


@st.composite
def ragged_rewards(draw):
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    rewards = draw(st.lists(reward_values, min_size=sum(sizes), max_size=sum(sizes)))
    return rewards, sizes


@SETTINGS
@given(ragged_rewards(), st.sampled_from(adv.NORMS), st.sampled_from(adv.STD_SCOPES))
def test_ragged_group_advantages_match_naive(data, norm, std_scope):
    rewards, sizes = data
    got = adv.group_advantages(t64(rewards), sizes, norm=norm, std_scope=std_scope)
    expected = naive.group_advantages(rewards, sizes, norm, std_scope)
    torch.testing.assert_close(got, t64(expected), rtol=1e-9, atol=1e-9)


@SETTINGS
@given(ragged_rewards(), st.sampled_from([0.0, 0.5]))
def test_ragged_zero_signal_rows_and_kinds_are_each_groups_own(data, eps):
    rewards, sizes = data
    mask, kinds = (
        adv.zero_signal_mask(t64(rewards), sizes, eps=eps),
        adv.zero_signal_kinds(t64(rewards), sizes, eps, 0, 1),
    )
    expected_mask, expected_kinds = [], []
    for group in naive.groups(rewards, sizes):
        expected_mask += [adv.zero_signal_mask(t64(group), len(group), eps=eps)[0].item()] * len(group)
        expected_kinds.append(adv.zero_signal_kinds(t64(group), len(group), eps, 0, 1).item())
    assert mask.tolist() == expected_mask
    assert kinds.tolist() == expected_kinds


@SETTINGS
@given(grouped_rewards(), st.sampled_from(adv.NORMS), st.sampled_from(adv.STD_SCOPES))
def test_equal_sizes_are_the_int_group_size_bit_for_bit(data, norm, std_scope):
    rewards, group_size = data
    sizes = [group_size] * (len(rewards) // group_size)
    for fn in (
        lambda g: adv.group_advantages(torch.tensor(rewards), g, norm=norm, std_scope=std_scope),
        lambda g: adv.zero_signal_mask(torch.tensor(rewards), g, 0.0),
        lambda g: adv.zero_signal_kinds(torch.tensor(rewards), g, 0.0, 0.0, 1.0),
    ):
        assert torch.equal(fn(sizes), fn(group_size))


def test_ragged_sizes_must_cover_the_rows():
    with pytest.raises(ValueError, match=r"5 rows cannot be split into groups of sizes \[2, 2\]"):
        adv.group_advantages(torch.zeros(5), [2, 2])
    with pytest.raises(ValueError, match="sizes"):
        adv.zero_signal_mask(torch.zeros(2), [2, 0])


def test_equal_rewards_near_100_nonzero_float32_advantage_still_flagged():
    rewards = torch.tensor([99.7, 99.7, 99.7, 0.0, 1.0, 0.0], dtype=torch.float32)
    advantages = adv.group_advantages(rewards, 3)
    assert advantages[:3].abs().min() > 0.01  # float32 residue: the mean of equal values is not exact
    assert torch.equal(advantages[:3], trl_sum_then_normalize(rewards, 3, "group")[:3])  # TRL has it too
    assert adv.zero_signal_mask(rewards, 3).tolist() == [True] * 3 + [False] * 3


def test_zero_signal_kinds_on_a_correctness_batch():
    rewards = torch.tensor([1.1, 1.1, 1.1, 0.1, 0.1, 0.1, 0.0, 0.1, 0.0, 1.1, 0.1, 0.1])
    kinds = adv.zero_signal_kinds(rewards, 3, 0.0, low=0.0, high=1.1)
    # 0.0 / 0.1 differ: the format reward is signal
    assert kinds.tolist() == [adv.ALL_MAX, adv.ALL_MIN, adv.INFORMATIVE, adv.INFORMATIVE]


# --- whiten / clip -------------------------------------------------------------------------------------


@SETTINGS
@given(st.lists(st.tuples(st.floats(-10, 10), st.booleans()), min_size=1, max_size=20), st.booleans())
def test_whiten_matches_naive(entries, shift_mean):
    values = [v for v, _ in entries]
    mask = [k for _, k in entries]
    kept = [v for v, k in entries if k]
    m = naive.mean(kept)
    var = naive.sample_std(kept) ** 2 if len(kept) > 1 else 0.0
    expected = []
    for v, k in entries:
        w = (v - m) / math.sqrt(var + 1e-8) + (0.0 if shift_mean else m) if k else v
        expected.append(w)
    got = adv.whiten(t64(values), torch.tensor(mask), shift_mean=shift_mean)
    torch.testing.assert_close(got, t64(expected), rtol=1e-7, atol=1e-7)


def test_whiten_without_mask_gives_zero_mean_unit_variance():
    got = adv.whiten(torch.randn(50, dtype=torch.float64) * 3 + 5)
    assert abs(got.mean().item()) < 1e-9 and abs(got.std().item() - 1) < 1e-6


def test_clip_advantages_matches_loop_and_validates():
    values = torch.randn(30) * 4
    got = adv.clip_advantages(values, 2.0)
    assert got.tolist() == [min(max(v, -2.0), 2.0) for v in values.tolist()]
    with pytest.raises(ValueError):
        adv.clip_advantages(values, 0.0)


# --- transform_rewards / RunningMoments ----------------------------------------------------------------


@SETTINGS
@given(st.lists(st.lists(reward_values, min_size=1, max_size=8), min_size=1, max_size=5))
def test_running_moments_match_all_at_once_statistics(chunks):
    state = adv.RunningMoments()
    for chunk in chunks:
        state.update(t64(chunk))
    seen = [x for chunk in chunks for x in chunk if not math.isnan(x)]
    assert state.count == len(seen)
    if seen:
        assert state.mean == pytest.approx(naive.mean(seen), abs=1e-9)
    expected_std = naive.sample_std(seen)
    assert state.std == pytest.approx(1.0 if expected_std is None else expected_std, abs=1e-9)


@SETTINGS
@given(
    st.lists(reward_values, min_size=1, max_size=12),
    st.sampled_from(["full", "shift", "scale"]),
    st.one_of(st.none(), st.floats(0.5, 3)),
)
def test_batch_transform_matches_naive_normalise_then_clip(rewards, kind, clip):
    valid = [x for x in rewards if not math.isnan(x)]
    m = naive.mean(valid) if valid else 0.0
    std = naive.sample_std(valid)
    std = 1.0 if std is None else std
    expected = []
    for x in rewards:
        y = {"full": (x - m) / (std + 1e-6), "shift": x - m, "scale": x / (std + 1e-6)}[kind]
        expected.append(y if clip is None or math.isnan(y) else min(max(y, -clip), clip))
    got = adv.transform_rewards(
        t64(rewards), norm="batch", clip=clip, shift_only=kind == "shift", scale_only=kind == "scale"
    )
    torch.testing.assert_close(got, t64(expected), rtol=1e-9, atol=1e-9, equal_nan=True)


def test_running_transform_uses_stats_including_current_batch():
    state = adv.RunningMoments()
    first, second = t64([1.0, 2.0, 3.0]), t64([10.0, math.nan, 14.0])
    adv.transform_rewards(first, norm="running", state=state)
    got = adv.transform_rewards(second, norm="running", state=state)
    seen = [1.0, 2.0, 3.0, 10.0, 14.0]
    m, std = naive.mean(seen), naive.sample_std(seen)
    expected = t64([(10.0 - m) / (std + 1e-6), math.nan, (14.0 - m) / (std + 1e-6)])
    torch.testing.assert_close(got, expected, equal_nan=True)
    assert state.count == 5


def test_clip_only_and_argument_errors():
    rewards = t64([-5.0, 0.5, 5.0])
    assert adv.transform_rewards(rewards, clip=1.0).tolist() == [-1.0, 0.5, 1.0]
    with pytest.raises(ValueError):
        adv.transform_rewards(rewards, norm="batch", shift_only=True, scale_only=True)
    with pytest.raises(ValueError):
        adv.transform_rewards(rewards, shift_only=True)
    with pytest.raises(ValueError):
        adv.transform_rewards(rewards, norm="running")


# --- process_advantages / turn_group_advantages --------------------------------------------------------------


def naive_process(rewards, mask, group_size, variant, gamma, norm):
    if variant == "outcome":
        totals = []
        for row, keep in zip(rewards, mask, strict=True):
            valid = [gamma**t * r for t, (r, k) in enumerate(zip(row, keep, strict=True)) if k]
            totals.append(sum(valid) if valid else math.nan)
        outcome = naive.group_advantages(totals, group_size, norm)
        return [[outcome[i] if k else 0.0 for k in keep] for i, keep in enumerate(mask)]
    if variant == "process":
        normalised = naive.normalise_steps(rewards, mask, group_size, norm, 1e-4)
        return [naive.return_to_go(row, keep, gamma) for row, keep in zip(normalised, mask, strict=True)]
    returns = [naive.return_to_go(row, keep, gamma) for row, keep in zip(rewards, mask, strict=True)]
    return naive.normalise_steps(returns, mask, group_size, norm, 1e-4)


@SETTINGS
@given(
    step_batch(),
    st.sampled_from(["outcome", "process", "process_rtg"]),
    st.sampled_from([1.0, 0.9]),
    st.sampled_from(adv.NORMS),
)
def test_process_advantages_match_naive(batch, variant, gamma, norm):
    rewards, mask, group_size = batch
    got = adv.process_advantages(
        t64(rewards), torch.tensor(mask), group_size, variant=variant, gamma=gamma, norm=norm
    )
    expected = naive_process(rewards, mask, group_size, variant, gamma, norm)
    torch.testing.assert_close(got, t64(expected), rtol=1e-7, atol=1e-7)


def cartpole_like(lengths, horizon=6):
    mask = torch.tensor([[t < n for t in range(horizon)] for n in lengths])
    return torch.ones(len(lengths), horizon), mask


def test_process_gives_zero_for_constant_step_rewards_but_rtg_does_not():
    rewards, mask = cartpole_like([2, 6, 3, 5])
    assert torch.equal(adv.process_advantages(rewards, mask, 4, variant="process"), torch.zeros(4, 6))
    rtg = adv.process_advantages(rewards, mask, 4, variant="process_rtg")
    assert rtg[1, 0] > rtg[3, 0] > rtg[2, 0] > rtg[0, 0]  # longer episode -> larger first-step advantage
    outcome = adv.process_advantages(rewards, mask, 4, variant="outcome")
    assert outcome[1, 0] > 0 > outcome[0, 0] and torch.equal(outcome[~mask], torch.zeros(int((~mask).sum())))


def test_length_one_episodes_and_empty_rows():
    rewards = torch.tensor([[1.0, 0.0], [3.0, 0.0], [5.0, 9.0], [2.0, 2.0]])
    mask = torch.tensor([[True, False], [True, False], [False, False], [True, False]])
    got = adv.process_advantages(rewards, mask, 2, variant="outcome")
    torch.testing.assert_close(got[:, 0], torch.tensor([-1.0, 1.0, 0.0, 0.0]) / (math.sqrt(2) + 1e-4))
    assert torch.equal(got[:, 1], torch.zeros(4))


@SETTINGS
@given(step_batch(), st.sampled_from(["turn", "group"]), st.sampled_from(adv.NORMS))
def test_turn_group_advantages_match_naive(batch, scope, norm):
    rewards, mask, group_size = batch
    got = adv.turn_group_advantages(t64(rewards), torch.tensor(mask), group_size, scope=scope, norm=norm)
    if scope == "group":
        expected = naive.normalise_steps(rewards, mask, group_size, norm, 1e-4)
    else:
        expected = [[0.0] * len(row) for row in rewards]
        for start in range(0, len(rewards), group_size):
            for k in range(len(rewards[0])):
                rows = [i for i in range(start, start + group_size) if mask[i][k]]
                pool = [rewards[i][k] for i in rows]
                for i in rows:
                    expected[i][k] = naive.normalise(
                        rewards[i][k], naive.mean(pool), naive.sample_std(pool), norm, 1e-4
                    )
    torch.testing.assert_close(got, t64(expected), rtol=1e-7, atol=1e-7)
