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
