"""GRPOHubTrainer + LoRA under DeepSpeed ZeRO-2 / ZeRO-3 on 2 CPU ranks (recipes/accelerate/cpu-zero*.yaml).

"task-rank1-flat" data: rank 0 scores the built-in task, rank 1 only constant-reward groups, so with
filtering on rank 1 has every row dropped at every step while rank 0 trains (tests/training/distributed/scenarios.py).
Every run of one ZeRO stage is trained in one launch (`runs`) and shared by the tests.
The first DeepSpeed launch JIT-builds deepspeed_shm_comm (1-4 min) into $TORCH_EXTENSIONS_DIR;
.ci/run builds it before the tests.
"""

import json

import pytest
from transformers import AutoTokenizer

from grpo_hub.tasks import build_tiny_model
from tests.conftest import requires
from tests.helpers import step_logs
from tests.training.distributed.checks import (
    TIME_BUDGET_RUN,
    assert_padding_free_matches,
    assert_stopped_at_the_slowest_ranks_plan,
    assert_trained_in_sync,
    assert_two_rank_world,
    padding_free_runs,
)
from tests.training.distributed.launch import run_accelerate_runs

pytestmark = [pytest.mark.distributed, pytest.mark.deepspeed, pytest.mark.slow]

STEPS = 20
ROWS_PER_RANK = 8
# The fully-filtered run's extra config per ZeRO stage.
FULLY_FILTERED = {
    "cpu-zero2.yaml": {"filter_zero_signal": True, "loss_type": "cispo"},
    "cpu-zero3.yaml": {"filter_zero_signal": True, "loss_agg_mode": "seq-mean-token-mean"},
}
# 2 micro-steps of 8 rows per optimizer step, every other group flat on both ranks; packed (None) and thin (False).
HALF_FLAT = ["--trainer", "hub", "--lora", "--scenario", "half-flat", "--grad-accum", "2"]
HALF_FLAT += ["--max-steps", "2", "--learning-rate", "5e-2", "--seed", "3"]
PACK = {"packed": None, "thin": False}
EOS = AutoTokenizer.from_pretrained(build_tiny_model()).eos_token_id


@pytest.fixture(scope="module", params=list(FULLY_FILTERED), ids=["zero2", "zero3"])
def runs(request) -> dict:
    """{name: result} of the fully-filtered, packed and thin runs, trained in one 2-rank launch of this stage."""
    requires("deepspeed", "ZeRO-2/3 on 2 CPU ranks")
    fully_filtered = ["--trainer", "hub", "--hub-config", json.dumps(FULLY_FILTERED[request.param])]
    fully_filtered += ["--lora", "--scenario", "task-rank1-flat"]
    fully_filtered += ["--max-steps", str(STEPS), "--learning-rate", "5e-2", "--seed", "3"]
    runs = {"fully_filtered": fully_filtered}
    for name, pack in PACK.items():
        hub_config = json.dumps({"filter_zero_signal": True, "zero_signal_pack": pack})
        runs[name] = [*HALF_FLAT, "--hub-config", hub_config]
    for name, config in padding_free_runs({}, EOS).items():  # LoRA and full fine-tuning, 3 steps each
        pf_run = ["--trainer", "hub", "--scenario", "task", "--max-steps", "3", "--learning-rate", "0.1",
                  "--hub-config", json.dumps(config)]  # fmt: skip
        runs[name], runs[f"{name}_full"] = [*pf_run, "--lora"], pf_run
    runs["time_budget"] = [*TIME_BUDGET_RUN, "--lora"]
    return run_accelerate_runs(request.param, "grpo_worker.py", runs)


def test_lora_training_with_one_rank_fully_filtered(runs):
    result = runs["fully_filtered"]

    assert_two_rank_world(result, "DEEPSPEED")
    assert result["trainer"] == "GRPOHubTrainer"
    assert result["n_trainable"] < 50_000, "expected only the LoRA adapter to be trainable"
    assert result["ranks"][0]["scored"] == {"live": STEPS * ROWS_PER_RANK}
    assert result["ranks"][1]["scored"] == {"flat": STEPS * ROWS_PER_RANK}
    assert_trained_in_sync(result, steps=STEPS)
    logs = step_logs(result)
    for entry in logs:
        kept = entry["zero_signal/rows_trained"]
        assert kept <= ROWS_PER_RANK, "rank 1 must keep no row"
        assert entry["zero_signal/rows_padded"] == 2 * max(kept, 1) - kept  # rank 1 pads up to rank 0's count
    rewards = [entry["rewards/task_on_live/mean"] for entry in logs]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.15, rewards


def test_time_budget_ranks_stop_at_the_slowest_ranks_plan_under_deepspeed(runs):
    """DeepSpeed takes transformers' scheduler (its config has no "scheduler" section): the plan re-lengthens it."""
    assert_stopped_at_the_slowest_ranks_plan(runs["time_budget"])


def test_packed_filtering_matches_unpacked_under_deepspeed(runs):
    """2 micro-steps of 8 rows per optimizer step, every other group flat on both ranks: packing runs 1 of them
    (8 kept rows per rank) and the update equals running both, thinner (loss, grad norm, final weights)."""
    for name in PACK:
        assert_two_rank_world(runs[name], "DEEPSPEED")
        assert_trained_in_sync(runs[name], steps=2)
    packed, thin = step_logs(runs["packed"]), step_logs(runs["thin"])
    assert [entry["zero_signal/micro_steps_run"] for entry in packed] == [1.0, 1.0]
    assert all("zero_signal/micro_steps_run" not in entry for entry in thin)
    for a, b in zip(packed, thin, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)
    # Adam divides by sqrt(v) + eps: a gradient component near eps turns float summation-order noise (one 16-row
    # micro-step vs two 8-row ones) into an update difference of up to ~lr/20, so weights agree to ~1e-5, not 1e-6
    # (ZeRO-3 on one 2-core machine: 990.7721 vs 990.7703).
    assert runs["packed"]["param_fingerprint"] == pytest.approx(runs["thin"]["param_fingerprint"], rel=1e-5)


@pytest.mark.parametrize("suffix", ["", "_full"], ids=["lora", "full"])
def test_padding_free_matches_the_padded_run_under_deepspeed(runs, suffix):
    assert_two_rank_world(runs[f"padding_free{suffix}"], "DEEPSPEED")
    assert_padding_free_matches(runs[f"padded{suffix}"], runs[f"padding_free{suffix}"], steps=3)
