"""Assertions shared by the distributed tests, over the results `launch.run_accelerate` returns."""

from __future__ import annotations

import math

from tests.helpers import step_logs


def assert_two_rank_world(result: dict, distributed_type: str) -> None:
    """Both ranks reported, each saw world size 2 over gloo with the expected accelerate distributed type."""
    assert [rank["rank"] for rank in result["ranks"]] == [0, 1]
    for rank in result["ranks"]:
        assert rank["world_size"] == 2, rank
        assert rank["backend"] == "gloo", rank
        assert rank["distributed_type"] == f"DistributedType.{distributed_type}", rank


def assert_trained_in_sync(result: dict, steps: int) -> None:
    """Every step ran with a finite loss and grad norm; weights moved, stayed finite, and agree on both ranks."""
    assert result["global_step"] == steps
    for entry in step_logs(result):
        assert math.isfinite(entry["loss"]) and math.isfinite(entry["grad_norm"]), entry
    ranks = result["ranks"]
    for rank in ranks:
        assert rank["params_finite"], rank
        assert rank["max_param_change"] > 0, "no trainable parameter changed"
    assert ranks[0]["param_fingerprint"] == ranks[1]["param_fingerprint"], "the ranks' weights diverged"


# grpo_worker.py arguments of a time-budget run: rank 1's scripted clock runs at half rank 0's speed
TIME_BUDGET_RUN = ["--scenario", "task", "--max-steps", "20", "--scripted-clock", "--trainer", "hub",
                   "--hub-config", '{"time_budget_seconds": 20.0}']  # fmt: skip


def assert_stopped_at_the_slowest_ranks_plan(result: dict) -> None:
    """TIME_BUDGET_RUN: rank 0 alone would plan 17 steps (1 s per step, 7 s spent at step 4); rank 1 (2 s per step,
    14 s spent) leaves room for 3 more: both ranks plan 7 and stop there, on the same schedule."""
    assert_trained_in_sync(result, steps=7)
    logged = [[entry for entry in rank["log_history"] if "loss" in entry] for rank in result["ranks"]]
    planned = [[entry["time_budget/planned_steps"] for entry in rank] for rank in logged]
    assert planned[0] == planned[1] == [20, 20, 20, 7, 7, 7, 7]
    rates = [[entry["learning_rate"] for entry in rank] for rank in logged]
    assert rates[0] == rates[1] and rates[0][-1] < rates[0][0] * 3 / 7  # the 7-step schedule's end, not 20's


def padding_free_runs(settings: dict, eos_token_id: int) -> dict:
    """Hub configs of a padded and a padding-free run: plain SGD (its step is proportional to the gradient, so the
    weights compare to fp32 rounding) and generation that favours the end token, so completions vary in length."""
    common = {**settings, "optim": "sgd", "generation_kwargs": {"sequence_bias": [[[eos_token_id], 6.0]]}}
    return {"padded": common, "padding_free": {**common, "padding_free": True}}


def assert_padding_free_matches(padded: dict, packed: dict, steps: int) -> None:
    """Both trained in sync; the padding-free run's model saw fewer tokens, and its losses, grad norms and weights
    are the padded run's to fp32 rounding."""
    assert_trained_in_sync(padded, steps)
    assert_trained_in_sync(packed, steps)
    for a, b in zip(padded["ranks"], packed["ranks"], strict=True):
        assert b["scored_tokens"] < a["scored_tokens"], (a["scored_tokens"], b["scored_tokens"])
        assert math.isclose(a["param_fingerprint"], b["param_fingerprint"], rel_tol=1e-6)
        assert math.isclose(a["max_param_change"], b["max_param_change"], rel_tol=1e-3)
    for a, b in zip(step_logs(padded), step_logs(packed), strict=True):
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-4, abs_tol=1e-6), (a["loss"], b["loss"])
        assert math.isclose(a["grad_norm"], b["grad_norm"], rel_tol=1e-4), (a["grad_norm"], b["grad_norm"])
