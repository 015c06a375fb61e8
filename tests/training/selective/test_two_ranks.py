"""Selective rollout with dynamic sampling on 2 CPU ranks (accelerate cpu-ddp.yaml: torchrun + gloo)."""

from pathlib import Path

import pytest

from tests.helpers import step_logs
from tests.training.distributed.checks import assert_two_rank_world
from tests.training.distributed.launch import run_accelerate

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKER = str(Path(__file__).with_name("selective_worker.py"))
NUM_GENERATIONS = 4


@pytest.mark.parametrize("mode", ["replace", "shrink"])
def test_two_ranks_take_the_same_skip_decisions_and_generate_whole_groups(mode):
    """shrink: a shrunk batch of 1 group puts 2 of its rows on each rank."""
    result = run_accelerate("cpu-ddp.yaml", WORKER, ["--max-steps", "4", "--mode", mode])
    assert_two_rank_world(result, "MULTI_CPU")
    ranks = result["ranks"]
    assert [rank["global_step"] for rank in ranks] == [4, 4]
    assert ranks[0]["decisions"] == ranks[1]["decisions"], "the ranks took different skip decisions"
    assert any(skip for _, skip in ranks[0]["decisions"]), "nothing was skipped: the test checks nothing"
    per_rank = [step_logs(rank) for rank in ranks]
    for entry0, entry1 in zip(*per_rank, strict=True):
        keys = (
            "selective_rollout/rows_saved",
            "selective_rollout/groups_generated",
            "dynamic_sampling/rounds",
        )
        for key in (*keys, "zero_signal/rows_trained"):
            assert entry0[key] == entry1[key], key
    assert ranks[0]["param_fingerprint"] == ranks[1]["param_fingerprint"], "the ranks' weights diverged"
    # both ranks together generated whole groups: every prompt index appears a multiple of num_generations times
    rows = ranks[0]["scored_rows"] + ranks[1]["scored_rows"]
    assert all(rows.count(index) % NUM_GENERATIONS == 0 for index in set(rows))
    assert sum(entry["selective_rollout/rows_saved"] for entry in per_rank[0]) > 0
    generated = [entry["selective_rollout/groups_generated"] for entry in per_rank[0]]
    assert min(generated) < 3 if mode == "shrink" else set(generated) == {3.0}
