"""grpo_hub.algos.importance against naive loop references, TRL 1.16's vLLM IS code, and edge cases."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_hub.algos import importance

SETTINGS = settings(max_examples=60, deadline=None)
logps = st.floats(-8.0, 0.0)
bounds = st.sampled_from([(None, 2.0), (0.5, 2.0), (0.8, None), (None, None), (0.9, 1.1)])


@st.composite
def logp_batch(draw, nan=True):
    rows, steps = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    sampler_values = st.one_of(logps, st.just(math.nan)) if nan else logps
    trainer = [draw(st.lists(logps, min_size=steps, max_size=steps)) for _ in range(rows)]
    sampler = [draw(st.lists(sampler_values, min_size=steps, max_size=steps)) for _ in range(rows)]
    mask = [draw(st.lists(st.booleans(), min_size=steps, max_size=steps)) for _ in range(rows)]
    return trainer, sampler, mask


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def naive_bound(w, low, high, mode):
    if mode == "truncate":
        w = w if low is None else max(w, low)
        return w if high is None else min(w, high)
    out_of_range = (low is not None and w < low) or (high is not None and w > high)
    return 0.0 if out_of_range else w


def naive_weights(trainer, sampler, mask, level, pooling, mode, low, high):
    out = []
    for t_row, s_row, keep in zip(trainer, sampler, mask, strict=True):
        diffs = [
            t - s if k and not math.isnan(s) else None for t, s, k in zip(t_row, s_row, keep, strict=True)
        ]
        if level == "token":
            out.append([naive_bound(math.exp(d or 0.0), low, high, mode) for d in diffs])
            continue
        pooled = [d for d in diffs if d is not None]
        log_w = sum(pooled)
        if pooling == "mean" and pooled:
            log_w /= len(pooled)
        out.append([naive_bound(math.exp(log_w), low, high, mode)])
    return out


@SETTINGS
@given(
    logp_batch(),
    st.sampled_from(["token", "sequence"]),
    st.sampled_from(["sum", "mean"]),
    st.sampled_from(["truncate", "mask"]),
    bounds,
)
def test_weights_match_naive(batch, level, pooling, mode, low_high):
    trainer, sampler, mask = batch
    low, high = low_high
    got = importance.rollout_is_weights(
        t64(trainer),
        t64(sampler),
        torch.tensor(mask),
        level=level,
        pooling=pooling,
        mode=mode,
        low=low,
        high=high,
    )
    expected = naive_weights(trainer, sampler, mask, level, pooling, mode, low, high)
    torch.testing.assert_close(got, t64(expected), rtol=1e-9, atol=1e-12)


def trl_vllm_is_ratio(old_per_token_logps, sampling_per_token_logps, mask, vllm_mode, clip_min, clip_max):
    """TRL 1.16 grpo_trainer.py lines 2660-2704, as written there."""
    per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)
    if vllm_mode in ["sequence_mask", "sequence_truncate"]:
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if vllm_mode in ["sequence_truncate", "token_truncate"]:
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    min_val = clip_min if clip_min is not None else -math.inf
    max_val = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)


@SETTINGS
@given(
    logp_batch(),
    st.sampled_from(["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]),
    st.sampled_from([(None, 3.0), (0.5, 2.0), (0.8, None), (0.9, 1.1)]),
)
def test_sum_pooling_reproduces_trl_vllm_modes_exactly(batch, vllm_mode, low_high):
    trainer, sampler, mask = batch
    low, high = low_high
    trainer32, sampler32 = torch.tensor(trainer), torch.tensor(sampler)
    mask_f = torch.tensor(mask, dtype=torch.float32)
    level, mode = vllm_mode.split("_")
    ours = importance.rollout_is_weights(
        trainer32, sampler32, mask_f, level=level, mode=mode, low=low, high=high
    )
    trl = trl_vllm_is_ratio(trainer32, sampler32, mask_f, vllm_mode, low, high)
    torch.testing.assert_close(ours, trl, rtol=0, atol=0)


@SETTINGS
@given(
    st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=8),
    st.sampled_from(["token", "sequence"]),
    st.sampled_from(["sum", "mean"]),
    st.sampled_from(["truncate", "mask"]),
    bounds,
)
def test_weights_finite_for_extreme_log_ratios(log_ratios, level, pooling, mode, low_high):
    trainer = torch.tensor([log_ratios], dtype=torch.float32)
    sampler = torch.zeros_like(trainer)
    low, high = low_high
    w = importance.rollout_is_weights(
        trainer,
        sampler,
        torch.ones_like(trainer),
        level=level,
        pooling=pooling,
        mode=mode,
        low=low,
        high=high,
    )
    assert torch.isfinite(w).all() and (w >= 0).all()


def test_geometric_mean_pooling_and_nan_tokens():
    trainer = torch.tensor([[-1.0, -2.0, -3.0, -1.0]])
    sampler = torch.tensor([[-1.5, -2.5, math.nan, -9.0]])
    mask = torch.tensor([[True, True, True, False]])
    product = importance.rollout_is_weights(trainer, sampler, mask, level="sequence", high=None)
    geometric = importance.rollout_is_weights(
        trainer, sampler, mask, level="sequence", pooling="mean", high=None
    )
    torch.testing.assert_close(product, torch.tensor([[math.exp(1.0)]]))  # NaN token and padding excluded
    torch.testing.assert_close(geometric, torch.tensor([[math.exp(0.5)]]))  # mean over the 2 pooled tokens
    token = importance.rollout_is_weights(trainer, sampler, mask, high=None)
    torch.testing.assert_close(token, torch.tensor([[math.exp(0.5), math.exp(0.5), 1.0, 1.0]]))


def test_length_one_completion_sum_equals_mean_and_weights_are_detached():
    trainer = torch.tensor([[-0.2, 0.0]], requires_grad=True)
    sampler, mask = torch.tensor([[-0.5, 0.0]]), torch.tensor([[True, False]])
    product = importance.rollout_is_weights(trainer, sampler, mask, level="sequence")
    geometric = importance.rollout_is_weights(trainer, sampler, mask, level="sequence", pooling="mean")
    assert torch.equal(product, geometric) and not product.requires_grad


def test_all_masked_rows_get_neutral_weight_and_arguments_are_validated():
    trainer, sampler = torch.randn(2, 3), torch.randn(2, 3)
    none = torch.zeros(2, 3, dtype=torch.bool)
    for pooling in ("sum", "mean"):
        w = importance.rollout_is_weights(trainer, sampler, none, level="sequence", pooling=pooling)
        assert torch.equal(w, torch.ones(2, 1))
    for bad in ({"level": "turn"}, {"pooling": "max"}, {"mode": "drop"}):
        with pytest.raises(ValueError):
            importance.rollout_is_weights(trainer, sampler, none, **bad)


# --- mismatch_stats ------------------------------------------------------------------------------------


@SETTINGS
@given(logp_batch())
def test_mismatch_stats_match_naive(batch):
    trainer, sampler, mask = batch
    got = importance.mismatch_stats(t64(trainer), t64(sampler), torch.tensor(mask))
    pairs = [
        (t, s)
        for t_row, s_row, keep in zip(trainer, sampler, mask, strict=True)
        for t, s, k in zip(t_row, s_row, keep, strict=True)
        if k and not math.isnan(s)
    ]
    if not pairs:
        assert got == {"abs_diff_mean": 0.0, "abs_diff_max": 0.0, "kl_k1": 0.0, "kl_k3": 0.0, "tokens": 0.0}
        return
    n = len(pairs)
    assert got["tokens"] == n
    assert got["abs_diff_mean"] == pytest.approx(sum(abs(t - s) for t, s in pairs) / n, abs=1e-12)
    assert got["abs_diff_max"] == pytest.approx(max(abs(t - s) for t, s in pairs), abs=1e-12)
    assert got["kl_k1"] == pytest.approx(sum(s - t for t, s in pairs) / n, abs=1e-12)
    k3 = sum(math.exp(t - s) - 1 - (t - s) for t, s in pairs) / n
    assert (
        got["kl_k3"] == pytest.approx(k3, abs=1e-12) and got["kl_k3"] >= -1e-12
    )  # k3 >= 0 up to float rounding


def test_mismatch_stats_nan_safe_and_extreme():
    trainer = torch.tensor([[-1e4, -1.0, -2.0]])
    sampler = torch.tensor([[0.0, math.nan, -2.0]])
    stats = importance.mismatch_stats(trainer, sampler, torch.ones(1, 3))
    assert all(math.isfinite(v) for v in stats.values()) and stats["tokens"] == 2
    assert stats["abs_diff_max"] == pytest.approx(1e4)


# --- effective_sample_size -----------------------------------------------------------------------------


@SETTINGS
@given(st.lists(st.floats(0.0, 50.0), max_size=12))
def test_effective_sample_size_matches_kish(weights):
    got = importance.effective_sample_size(t64(weights))
    total, square = sum(weights), sum(w * w for w in weights)
    expected = 1.0 if square == 0 else total * total / (len(weights) * square)
    assert got == pytest.approx(expected, rel=1e-12)
    assert 0.0 < got <= 1.0 + 1e-12


def test_effective_sample_size_bounds():
    assert importance.effective_sample_size(torch.ones(5)) == pytest.approx(1.0)
    assert importance.effective_sample_size(torch.tensor([0.0, 0.0, 7.0, 0.0])) == pytest.approx(0.25)
    assert importance.effective_sample_size(torch.tensor([])) == 1.0
