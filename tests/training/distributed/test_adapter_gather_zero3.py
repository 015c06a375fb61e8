"""`vllm_adapter_sync` under DeepSpeed ZeRO-3 on 2 CPU ranks (no vLLM: the vLLM environment has no DeepSpeed): the
sync's gather materialises the trained adapter only, whole, identical on both ranks and equal to the same tensors
gathered with every parameter (adapter_gather_worker.py). One launch, ~1 min."""

import pytest

from tests.conftest import requires
from tests.training.distributed.launch import partitioned_zero3_config, run_accelerate

pytestmark = [pytest.mark.distributed, pytest.mark.deepspeed, pytest.mark.slow]


def test_zero3_sync_gathers_the_whole_adapter_and_nothing_else(tmp_path):
    requires("deepspeed", "ZeRO-3 adapter gather")
    config = str(partitioned_zero3_config(tmp_path))  # LoRA factors really sharded (persistence threshold 0)
    result = run_accelerate(config, "adapter_gather_worker.py")
    ranks = result["ranks"]
    assert "DEEPSPEED" in result["distributed_type"] and [r["world_size"] for r in ranks] == [2, 2]
    for rank in ranks:
        gather = rank["gather"]
        assert gather["adapter_partitioned_before"], (
            "the adapter was not sharded: the test would prove nothing"
        )
        assert gather["shapes_full"] and gather["adapter_tensors"] > 0
        assert gather["others_partitioned_after"], "a base weight was gathered and left materialised"
        assert gather["copies_sha"] == gather["all_gathered_sha"]
    assert ranks[0]["gather"]["copies_sha"] == ranks[1]["gather"]["copies_sha"]
