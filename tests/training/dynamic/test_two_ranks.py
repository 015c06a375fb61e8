"""Dynamic sampling on 2 CPU ranks (accelerate cpu-ddp.yaml: torchrun + gloo): same rounds, no hang."""

from pathlib import Path

import pytest

from tests.helpers import step_logs
from tests.training.distributed.checks import assert_two_rank_world
from tests.training.distributed.launch import run_accelerate

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKER = str(Path(__file__).with_name("dynamic_worker.py"))
TARGET_ROWS = 4 * 4  # one generation batch: 4 groups of 4 completions over the 2 ranks (dynamic_worker.py)


def test_two_ranks_agree_on_rounds_and_train_full_informative_batches():
    result = run_accelerate("cpu-ddp.yaml", WORKER, ["--max-steps", "3"])
    assert_two_rank_world(result, "MULTI_CPU")
    ranks = result["ranks"]
    assert [rank["global_step"] for rank in ranks] == [3, 3]
    per_rank = [step_logs(rank) for rank in ranks]
    for entry0, entry1 in zip(*per_rank, strict=True):
        assert entry0["dynamic_sampling/rounds"] == entry1["dynamic_sampling/rounds"] >= 1
        assert (
            entry0["dynamic_sampling/rows_trained"] == entry1["dynamic_sampling/rows_trained"] == TARGET_ROWS
        )
        assert entry0["dynamic_sampling/cap_hit"] == 0.0
    assert ranks[0]["param_fingerprint"] == ranks[1]["param_fingerprint"], "the ranks' weights diverged"
    # every prompt of the consumed generation batches was scored on exactly one rank, none twice
    scored = sorted(ranks[0]["scored_prompts"] + ranks[1]["scored_prompts"])
    assert scored == list(range(len(scored)))
    rounds = sum(entry["dynamic_sampling/rounds"] for entry in per_rank[0])
    assert len(scored) == (3 + rounds) * 4  # 4 prompts per generation batch
