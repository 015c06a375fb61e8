"""grpo_hub.algos.losses against naive loop references, TRL 1.16's formulas, and edge cases."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_hub.algos import losses

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def token_batch(draw, low=-3.0, high=3.0):
    """(values, mask, turn_ids) as nested lists, rows of equal length T."""
    rows, steps = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    values = [draw(st.lists(st.floats(low, high), min_size=steps, max_size=steps)) for _ in range(rows)]
    mask = [draw(st.lists(st.booleans(), min_size=steps, max_size=steps)) for _ in range(rows)]
    turns = [sorted(draw(st.lists(st.integers(0, 2), min_size=steps, max_size=steps))) for _ in range(rows)]
    return values, mask, turns


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def with_masked_garbage(values, mask, garbage):
    """Same tensor with every masked-out entry replaced by `garbage` (NaN, inf, or a number)."""
    return torch.where(torch.tensor(mask), t64(values), garbage)


# --- pool_log_ratio ------------------------------------------------------------------------------------


def naive_pool(values, mask, turns, level):
    out = []
    for row, keep, ids in zip(values, mask, turns, strict=True):
        if level == "token":
            out.append(list(row))
            continue
        unit_of = [0] * len(row) if level == "sequence" else ids
        pooled = []
        for t in range(len(row)):
            members = [row[u] for u in range(len(row)) if keep[u] and unit_of[u] == unit_of[t]]
            mean = sum(members) / len(members) if members else 0.0
            pooled.append(mean if keep[t] or level == "sequence" else 0.0)
        out.append(pooled)
    return out


@SETTINGS
@given(token_batch(), st.sampled_from(losses.LEVELS))
def test_pool_log_ratio_matches_naive(batch, level):
    values, mask, turns = batch
    got = losses.pool_log_ratio(t64(values), torch.tensor(mask), level, turn_ids=torch.tensor(turns))
    torch.testing.assert_close(got, t64(naive_pool(values, mask, turns, level)))


@SETTINGS
@given(token_batch(), st.sampled_from(["sequence", "turn"]), st.sampled_from([math.nan, math.inf, 7.0]))
def test_pool_log_ratio_ignores_masked_values(batch, level, garbage):
    values, mask, turns = batch
    keep, ids = torch.tensor(mask), torch.tensor(turns)
    clean = losses.pool_log_ratio(t64(values), keep, level, turn_ids=ids)
    dirty = losses.pool_log_ratio(with_masked_garbage(values, mask, garbage), keep, level, turn_ids=ids)
    assert torch.equal(clean[keep], dirty[keep])


def test_sequence_level_equals_trl_formula_and_gradient():
    torch.manual_seed(0)
    log_ratio = torch.randn(5, 7, requires_grad=True)
    mask = torch.rand(5, 7) > 0.3
    mask[2] = False  # an all-masked row
    ours = losses.pool_log_ratio(log_ratio, mask, "sequence")
    maskf = mask.float()
    trl = ((log_ratio * maskf).sum(-1) / maskf.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    torch.testing.assert_close(ours, trl.expand_as(ours), rtol=0, atol=0)
    (grad_ours,) = torch.autograd.grad((ours[:, :1] * torch.arange(5.0)[:, None]).sum(), log_ratio)
    (grad_trl,) = torch.autograd.grad((trl * torch.arange(5.0)[:, None]).sum(), log_ratio)
    torch.testing.assert_close(grad_ours, grad_trl)


def test_turn_level_needs_ids_and_level_is_validated():
    with pytest.raises(ValueError, match="turn_ids"):
        losses.pool_log_ratio(torch.zeros(1, 2), torch.ones(1, 2), "turn")
    with pytest.raises(ValueError, match="level"):
        losses.pool_log_ratio(torch.zeros(1, 2), torch.ones(1, 2), "chunk")


# --- clipped_surrogate / cispo -------------------------------------------------------------------------

ratios = st.floats(0.0, 10.0)
advs = st.floats(-3.0, 3.0)


def naive_surrogate(r, a, eps_low, eps_high, dual_clip):
    clipped = min(max(r, 1 - eps_low), 1 + eps_high)
    loss = -min(r * a, clipped * a)
    if dual_clip is not None and a < 0:
        loss = min(loss, -dual_clip * a)
    return loss


@SETTINGS
@given(
    st.lists(st.tuples(ratios, advs), min_size=1, max_size=20),
    st.floats(0.05, 0.5),
    st.floats(0.05, 0.5),
    st.one_of(st.none(), st.floats(1.01, 5.0)),
)
def test_clipped_surrogate_matches_naive(pairs, eps_low, eps_high, dual_clip):
    r = t64([p[0] for p in pairs])
    a = t64([p[1] for p in pairs])
    got = losses.clipped_surrogate(r, a, eps_low, eps_high, dual_clip)
    expected = [naive_surrogate(x, y, eps_low, eps_high, dual_clip) for x, y in pairs]
    torch.testing.assert_close(got, t64(expected))


def trl_delta_loss(coef_1, advantages, eps_low, eps_high, delta):
    """TRL 1.16 grpo_trainer.py lines 3113-3120, as written there."""
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    coef_1 = torch.clamp(coef_1, max=delta)
    return -torch.min(coef_1 * advantages, coef_2 * advantages)


@SETTINGS
@given(
    st.lists(st.tuples(ratios, advs), min_size=1, max_size=20),
    st.floats(0.05, 0.5),
    st.floats(0.05, 0.5),
    st.floats(0.01, 4.0),
)
def test_dual_clip_equals_trl_delta_when_c_above_one_plus_eps_high(pairs, eps_low, eps_high, margin):
    r = t64([p[0] for p in pairs])
    a = t64([p[1] for p in pairs])
    c = 1 + eps_high + margin
    ours = losses.clipped_surrogate(r, a, eps_low, eps_high, dual_clip=c)
    torch.testing.assert_close(ours, trl_delta_loss(r, a, eps_low, eps_high, c), rtol=0, atol=0)


def test_dual_clip_differs_from_trl_delta_below_one_plus_eps_high():
    r, a = t64([1.15]), t64([1.0])  # A > 0, δ = 1.1 < 1 + ε_high = 1.2
    assert losses.clipped_surrogate(r, a, 0.2, 0.2, dual_clip=1.1).item() == pytest.approx(-1.15)
    assert trl_delta_loss(r, a, 0.2, 0.2, 1.1).item() == pytest.approx(-1.1)


def test_dual_clip_caps_negative_advantage_loss_and_validates():
    r, a = t64([100.0, 100.0]), t64([-1.0, 1.0])
    assert losses.clipped_surrogate(r, a, 0.2, 0.2).tolist() == [100.0, -1.2]
    assert losses.clipped_surrogate(r, a, 0.2, 0.2, dual_clip=3.0).tolist() == [3.0, -1.2]
    with pytest.raises(ValueError):
        losses.clipped_surrogate(r, a, 0.2, 0.2, dual_clip=1.0)


@SETTINGS
@given(
    st.lists(st.tuples(ratios, advs, st.floats(-5, 0)), min_size=1, max_size=20),
    st.one_of(st.none(), st.floats(0.0, 0.9)),
    st.one_of(st.none(), st.floats(1.0, 6.0)),
)
def test_cispo_matches_naive(triples, low, high):
    r, a, logp = (t64([x[i] for x in triples]) for i in range(3))
    got = losses.cispo_loss(r, a, logp, low=low, high=high)
    expected = []
    for x, y, lp in triples:
        bounded = x if low is None else max(x, low)
        bounded = bounded if high is None else min(bounded, high)
        expected.append(-bounded * y * lp)
    torch.testing.assert_close(got, t64(expected))


def test_cispo_equals_trl_and_gradient_flows_through_logp_only():
    torch.manual_seed(1)
    logp = (torch.rand(3, 4) * -3).requires_grad_()
    old = torch.rand(3, 4) * -3
    ratio = torch.exp(logp - old)
    advantages = torch.randn(3, 1)
    ours = losses.cispo_loss(ratio, advantages, logp, high=5.0)
    trl = -torch.clamp(ratio, max=5.0).detach() * advantages * logp  # TRL 1.16 lines 3110-3111
    torch.testing.assert_close(ours, trl, rtol=0, atol=0)
    (grad,) = torch.autograd.grad(ours.sum(), logp)
    torch.testing.assert_close(grad, (-ratio.clamp(max=5.0) * advantages).detach().expand(3, 4))


# --- kl_penalty ----------------------------------------------------------------------------------------


@SETTINGS
@given(st.lists(st.tuples(st.floats(-30, 0), st.floats(-30, 0)), min_size=1, max_size=20))
def test_kl_estimators_match_naive(pairs):
    logp, ref = t64([p[0] for p in pairs]), t64([p[1] for p in pairs])
    for kind in ("k1", "k2", "k3"):
        expected = []
        for lp, rp in pairs:
            d = rp - lp
            bounded = min(max(d, -20.0), 20.0)
            expected.append({"k1": lp - rp, "k2": d * d / 2, "k3": math.exp(bounded) - bounded - 1}[kind])
        torch.testing.assert_close(losses.kl_penalty(logp, ref, kind), t64(expected))
    assert (losses.kl_penalty(logp, ref, "k3") >= -1e-12).all()  # k3 >= 0 up to float rounding


def test_k3_equals_trl_per_token_kl_and_extremes_stay_finite():
    torch.manual_seed(2)
    logp, ref = torch.rand(4, 6) * -5, torch.rand(4, 6) * -5
    trl = torch.exp(ref - logp) - (ref - logp) - 1  # TRL 1.16 lines 3100-3102
    torch.testing.assert_close(losses.kl_penalty(logp, ref), trl, rtol=0, atol=0)
    extreme = losses.kl_penalty(torch.tensor([-1e4, 0.0]), torch.tensor([0.0, -1e4]))
    assert torch.isfinite(extreme).all()
    with pytest.raises(ValueError):
        losses.kl_penalty(logp, ref, "k4")


# --- aggregate_loss ------------------------------------------------------------------------------------


def naive_aggregate(values, mask, mode, norm_length):
    sums, counts = [], []
    for row, keep in zip(values, mask, strict=True):
        sums.append(sum(v for v, k in zip(row, keep, strict=True) if k))
        counts.append(sum(1 for k in keep if k))
    nonempty = [i for i, c in enumerate(counts) if c > 0]
    if not nonempty:
        return 0.0
    if mode == "token-mean":
        return sum(sums) / sum(counts)
    if mode == "seq-mean-token-mean":
        return sum(sums[i] / counts[i] for i in nonempty) / len(nonempty)
    seq_mean = sum(sums[i] for i in nonempty) / len(nonempty)
    return seq_mean / (norm_length or len(values[0])) if mode == "seq-mean-token-sum-norm" else seq_mean


@SETTINGS
@given(token_batch(), st.sampled_from(losses.AGG_MODES), st.sampled_from([None, 16]))
def test_aggregate_loss_matches_naive(batch, mode, norm_length):
    values, mask, _ = batch
    got = losses.aggregate_loss(t64(values), torch.tensor(mask), mode, norm_length=norm_length)
    assert got.item() == pytest.approx(naive_aggregate(values, mask, mode, norm_length), abs=1e-9)


@SETTINGS
@given(token_batch(), st.sampled_from(losses.AGG_MODES), st.sampled_from([math.nan, -math.inf, 1e6]))
def test_aggregate_loss_ignores_masked_values_and_their_gradients(batch, mode, garbage):
    values, mask, _ = batch
    keep = torch.tensor(mask)
    clean = losses.aggregate_loss(t64(values), keep, mode)
    dirty_input = with_masked_garbage(values, mask, garbage).requires_grad_()
    dirty = losses.aggregate_loss(dirty_input, keep, mode)
    assert torch.equal(clean, dirty.detach())
    (grad,) = torch.autograd.grad(dirty, dirty_input)
    assert torch.equal(grad[~keep], torch.zeros(int((~keep).sum()), dtype=torch.float64))


def test_aggregate_loss_matches_trl_denominators_and_handles_empty_rows():
    torch.manual_seed(3)
    per_token, mask = torch.randn(6, 8), torch.rand(6, 8) > 0.4
    mask[:, 0] = True  # no empty row: TRL's divide-by-B conventions agree
    m = mask.float()
    grpo = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    bnpo = (per_token * m).sum() / m.sum().clamp(min=1.0)
    dr_grpo = (per_token * m).sum() / (per_token.size(0) * 32)
    torch.testing.assert_close(losses.aggregate_loss(per_token, mask, "seq-mean-token-mean"), grpo)
    torch.testing.assert_close(losses.aggregate_loss(per_token, mask, "token-mean"), bnpo)
    torch.testing.assert_close(
        losses.aggregate_loss(per_token, mask, "seq-mean-token-sum-norm", norm_length=32), dr_grpo
    )
    empty = torch.zeros(6, 8, dtype=torch.bool)
    for mode in losses.AGG_MODES:
        assert losses.aggregate_loss(per_token, empty, mode).item() == 0.0
    with pytest.raises(ValueError):
        losses.aggregate_loss(per_token, mask, "sum")


def test_length_one_completions_and_sequence_level_loss_broadcast():
    per_seq = torch.tensor([[2.0], [4.0]])  # (B, 1) loss from sequence-level ratios
    mask = torch.tensor([[True, False, False], [True, True, True]])
    assert losses.aggregate_loss(per_seq, mask, "seq-mean-token-mean").item() == 3.0
    assert losses.aggregate_loss(per_seq, mask, "token-mean").item() == pytest.approx(14.0 / 4)
