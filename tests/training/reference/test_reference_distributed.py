"""2 CPU ranks (DDP over gloo, DeepSpeed ZeRO-3 in fp32 and bf16): every rank ends with identical, correctly
refreshed reference weights, and a ZeRO-3 resume continues with the saved reference. Each launch takes ~40-60 s;
where the straight and the resumed run share an accelerate config, both run in one launch."""

from pathlib import Path

import pytest

from tests.conftest import requires
from tests.training.distributed.launch import partitioned_zero3_config, run_accelerate_runs, zero3_config

WORKER = str(Path(__file__).with_name("ref_worker.py"))
pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _check_ranks(result: dict, hard: bool) -> None:
    """World of 2, ref frozen, refreshed at 2 and 4, ranks agree from the first refresh on, KL ~0 after it."""
    ranks = result["ranks"]
    assert len(ranks) == 2 and all(rank["world_size"] == 2 for rank in ranks)
    for rank in ranks:
        assert rank["refreshed_at"] == [2, 4] and not rank["ref_trainable"]
        assert (rank["final"]["max_ref_minus_trained"] == 0.0) == hard  # hard copy: ref == trained everywhere
    for step in ("3", "4"):
        assert len({rank["steps"][step]["ref"] for rank in ranks}) == 1, f"ranks disagree at step {step}"
    assert len({rank["final"]["ref"] for rank in ranks}) == 1
    steps = ranks[0]["steps"]
    assert steps["1"]["ref"] == steps["2"]["ref"]  # unchanged until the step-2 refresh (probe runs before it)
    assert steps["3"]["ref"] != steps["2"]["ref"]
    assert (steps["3"]["ref"] == steps["2"]["trained"]) == hard
    if hard:
        assert ranks[0]["kl"]["3"] < 1e-7 < ranks[0]["kl"]["2"]


def test_ddp_ranks_hold_identical_refreshed_reference():
    """EMA (alpha 0.5) after rank 1's reference was offset: the refresh broadcasts rank 0's result."""
    args = ["--max-steps", "4", "--sync-steps", "2", "--alpha", "0.5", "--perturb-rank1-ref"]
    result = run_accelerate_runs("cpu-ddp.yaml", WORKER, {"run": args})["run"]
    assert "MULTI_CPU" in result["distributed_type"] or "MULTI_GPU" in result["distributed_type"]
    assert not result["ref_partitioned"]
    ranks = result["ranks"]
    assert ranks[0]["steps"]["2"]["ref"] != ranks[1]["steps"]["2"]["ref"]  # the offset took effect
    # DDP: every rank's own storage is the whole tensor, so equal local hashes mean equal weights.
    assert len({rank["final"]["local_ref"] for rank in ranks}) == 1
    _check_ranks(result, hard=False)


@pytest.mark.deepspeed
def test_zero3_refresh_and_resume(tmp_path):
    requires("deepspeed", "ZeRO-3 reference-adapter refresh")
    zero3 = str(partitioned_zero3_config(tmp_path))  # LoRA factors really sharded, not kept whole
    args = ["--max-steps", "4", "--sync-steps", "2", "--save-steps", "2"]
    runs = {"straight": straight_args(args, tmp_path), "resumed": resumed_args(args, tmp_path)}
    runs = run_accelerate_runs(zero3, WORKER, runs)
    straight = runs["straight"]
    assert "DEEPSPEED" in straight["distributed_type"] and straight["ref_partitioned"]
    # ZeRO-3: each rank stores a different shard, yet the gathered reference equals the trained adapter.
    assert straight["ranks"][0]["final"]["local_ref"] != straight["ranks"][1]["final"]["local_ref"]
    _check_ranks(straight, hard=True)
    _check_resume(straight, runs["resumed"])


@pytest.mark.deepspeed
def test_zero3_bf16_refresh_and_resume_with_and_without_init_flag(tmp_path):
    """bf16 model under ZeRO-3: TRL keeps its LoRA factors bf16 (autocast_adapter_dtype=False) and the reference
    adapter used to be added in fp32, so the trainer failed to build ("do not pair"), with either init flag.
    The straight run is built under zero.Init, the resumed one without it."""
    requires("deepspeed", "ZeRO-3 reference-adapter refresh under bf16")
    args = ["--max-steps", "4", "--sync-steps", "2", "--save-steps", "2", "--bf16"]
    zero3 = str(zero3_config(tmp_path, init_flag=True))
    straight = run_accelerate_runs(zero3, WORKER, {"run": straight_args(args, tmp_path)})["run"]
    assert "DEEPSPEED" in straight["distributed_type"]
    assert straight["adapter_dtypes"] == ["torch.bfloat16"]
    _check_ranks(straight, hard=True)
    zero3 = str(zero3_config(tmp_path, init_flag=False))
    _check_resume(straight, run_accelerate_runs(zero3, WORKER, {"run": resumed_args(args, tmp_path)})["run"])


def straight_args(args: list[str], tmp_path) -> list[str]:
    """The straight run: checkpoints (with the reference) in tmp/a."""
    return [*args, "--output-dir", str(tmp_path / "a")]


def resumed_args(args: list[str], tmp_path) -> list[str]:
    """The resumed run: from the straight run's step-2 checkpoint, writing into its own folder tmp/b."""
    return [*args, "--output-dir", str(tmp_path / "b"), "--resume", str(tmp_path / "a" / "checkpoint-2")]


def _check_resume(straight: dict, resumed: dict) -> None:
    """Resumed from the straight run's step-2 checkpoint: the saved reference replaces the fresh copy."""
    for rank in resumed["ranks"]:
        assert rank["refreshed_at"] == [4]
        # Built fresh, the reference starts as the untrained copy; the checkpoint's step-2 reference replaces it.
        assert rank["steps"]["begin"]["ref"] != straight["steps"]["3"]["ref"]
        assert rank["steps"]["3"]["ref"] == straight["steps"]["3"]["ref"]
        assert rank["final"]["ref"] == rank["final"]["trained"]
