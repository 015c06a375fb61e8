"""2 CPU ranks (accelerate cpu-ddp.yaml: torchrun + gloo) running TRL and grpo_hub GRPO on the tiny model.

The crafted "rank1-flat" data puts only constant-reward (zero-signal) groups on rank 1, so with
filtering on rank 1 has every row dropped while rank 0 trains; see tests/training/distributed/scenarios.py.
Every run is trained in one launch (RUNS) and shared by the tests. That a rank with every row filtered trains like
plain TRL is a promise of the equivalence suite (tests/training/test_equivalence.py).
"""

import json
import math

import pytest
from transformers import AutoTokenizer

from grpo_hub.tasks import build_tiny_model
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

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

CONFIG = "cpu-ddp.yaml"
ROWS_PER_RANK = 8  # 2 prompts x 4 generations per rank and generation batch (grpo_worker.py)


def run_args(*args: str, hub_config: dict | None = None) -> list[str]:
    """grpo_worker.py arguments: plain TRL, or GRPOHubTrainer with `hub_config`."""
    trainer = (
        ["--trainer", "trl"]
        if hub_config is None
        else ["--trainer", "hub", "--hub-config", json.dumps(hub_config)]
    )
    return [*trainer, *args]


RANK1_FLAT = ("--scenario", "rank1-flat", "--max-steps", "2", "--grad-accum", "2")
RUNS = {
    # plain trl.GRPOTrainer, 2 steps of 2 micro-steps on the rank1-flat data (the harness check and the baseline)
    "trl_rank1_flat": run_args(*RANK1_FLAT),
    "all_flat": run_args(
        "--scenario", "all-flat", "--max-steps", "2", "--grad-accum", "2", hub_config={"filter_zero_signal": True}
    ),
    "task": run_args(
        "--scenario", "task", "--max-steps", "20", "--learning-rate", "1e-2", "--seed", "3",
        hub_config={"filter_zero_signal": True},
    ),
    "time_budget": TIME_BUDGET_RUN,
}  # fmt: skip
EOS = AutoTokenizer.from_pretrained(build_tiny_model()).eos_token_id
for _name, _config in padding_free_runs({}, EOS).items():  # full fine-tuning and LoRA, 3 steps each
    RUNS[_name] = run_args(
        "--scenario", "task", "--max-steps", "3", "--learning-rate", "0.1", hub_config=_config
    )
    RUNS[f"{_name}_lora"] = run_args(
        "--lora", "--scenario", "task", "--max-steps", "3", "--learning-rate", "0.1", hub_config=_config
    )


@pytest.fixture(scope="module")
def runs() -> dict:
    """{name: result} of every run of RUNS, trained one after the other in one 2-rank launch."""
    return run_accelerate_runs(CONFIG, "grpo_worker.py", RUNS)


def test_plain_trl_runs_on_two_gloo_ranks_with_the_crafted_layout(runs):
    result = runs["trl_rank1_flat"]
    assert_two_rank_world(result, "MULTI_CPU")
    assert result["trainer"] == "GRPOTrainer"
    assert result["ranks"][0]["scored"] == {"live": 2 * 2 * ROWS_PER_RANK}
    assert result["ranks"][1]["scored"] == {"flat": 2 * 2 * ROWS_PER_RANK}
    assert [entry["frac_reward_zero_std"] for entry in step_logs(result)] == [0.5, 0.5]
    assert_trained_in_sync(result, steps=2)


def test_both_ranks_stop_at_the_slowest_ranks_plan(runs):
    assert_stopped_at_the_slowest_ranks_plan(runs["time_budget"])


def test_all_rows_filtered_on_both_ranks_is_a_no_op_step(runs):
    """Every group zero-signal, 2 micro-steps per batch: one pad row per rank and micro-step, zero update."""
    result = runs["all_flat"]
    assert_two_rank_world(result, "MULTI_CPU")
    assert result["global_step"] == 2
    for entry in step_logs(result):
        assert entry["zero_signal/frac_rows_dropped"] == 1.0
        assert entry["zero_signal/rows_trained"] == 0
        assert entry["zero_signal/rows_padded"] == 2 * 2  # ranks x steps_per_generation
        assert (
            entry["zero_signal/micro_steps_run"] == 1
        )  # the one that ends the optimizer step, on one pad row
        assert entry["loss"] == 0.0 and entry["grad_norm"] == 0.0
    for rank in result["ranks"]:
        assert rank["params_finite"] and rank["max_param_change"] == 0.0


def test_filtered_training_raises_the_task_reward(runs):
    result = runs["task"]
    assert_two_rank_world(result, "MULTI_CPU")
    assert_trained_in_sync(result, steps=20)
    rewards = [entry["reward"] for entry in step_logs(result)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert math.isfinite(first) and last > first + 0.15, rewards


@pytest.mark.parametrize("suffix", ["", "_lora"], ids=["full", "lora"])
def test_padding_free_matches_the_padded_run_on_two_ranks(runs, suffix):
    assert_two_rank_world(runs[f"padding_free{suffix}"], "MULTI_CPU")
    assert_padding_free_matches(runs[f"padded{suffix}"], runs[f"padding_free{suffix}"], steps=3)
