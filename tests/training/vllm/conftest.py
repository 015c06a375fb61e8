"""The vLLM runs that the tests of this folder inspect, each trained once per session: every 1-rank run in one
process and every 2-rank run in one 2-rank launch (the imports and the first engine start are most of a run's
time; see colocate_worker.py). A run is GRPOHubConfig overrides of the worker's BASE_CONFIG, plus `lora_r`."""

import pytest

from tests.training.vllm.engine import run_worker

LEARNING_RATE = 5e-2  # large, so stale engine weights would show up as a large mismatch within 3 steps
# 4 rows per rank = 1 group per rank and generation batch; the target asks for 2 groups per rank.
DYNAMIC = {
    "dynamic_sampling": True,
    "dynamic_sampling_max_rounds": 3,
    "max_steps": 2,
    "shuffle_dataset": False,
}
# LoRA runs probed after every weight sync (sync_probe.py): TRL's merged sync vs vllm_adapter_sync, same seed.
ADAPTER = {"lora_r": 16, "probe": True, "learning_rate": LEARNING_RATE, "max_steps": 3}
# prompts of varied length (colocate_worker.py), which TRL pads: padding_free has tokens to leave out
AGILERL = {
    "vllm_is_preset": "agilerl",
    "learning_rate": LEARNING_RATE,
    "max_steps": 3,
    "varied_prompts": True,
}
ONE_RANK_RUNS = {
    "agilerl": AGILERL,
    "agilerl_trl": {
        **AGILERL,
        "trl_path": True,
    },  # TRL's scoring forward: the baseline of test_vllm_colocate.py
    "agilerl_padding_free": {**AGILERL, "padding_free": True},
    "agilerl_shared_prompts": {**AGILERL, "padding_free": True, "shared_prompts": True},
    "uncorrected": {
        "vllm_importance_sampling_correction": False,
        "learning_rate": LEARNING_RATE,
        "max_steps": 1,
    },
    "geometric": {
        "vllm_importance_sampling_mode": "sequence_truncate",
        "vllm_is_pooling": "mean",
        "vllm_importance_sampling_clip_min": 0.99,
        "vllm_importance_sampling_clip_max": 1.01,
        "max_steps": 1,
    },
    "dynamic": {**DYNAMIC, "dynamic_sampling_target_groups": 2},
    "lora_merged": ADAPTER,
    "lora_adapter": {**ADAPTER, "vllm_adapter_sync": True, "probe": "compare_merged"},
    "adapter_ref": {
        **ADAPTER,
        "vllm_adapter_sync": True,
        "beta": 0.04,
        "ref_adapter_sync_on": "steps",
        "ref_adapter_sync_steps": 2,
    },
    "adapter_rollout": {
        **ADAPTER,
        **DYNAMIC,
        "dynamic_sampling_target_groups": 2,
        "selective_rollout": True,
        "vllm_adapter_sync": True,
    },
}
TWO_RANK_RUNS = {
    "lora_mask": {
        "vllm_importance_sampling_mode": "token_mask",
        "vllm_importance_sampling_clip_min": 0.97,
        "vllm_importance_sampling_clip_max": 1.03,
        "learning_rate": LEARNING_RATE,
        "lora_r": 16,
    },
    "dynamic": {**DYNAMIC, "dynamic_sampling_target_groups": 4},
    "adapter_mask": {
        **ADAPTER,
        "vllm_adapter_sync": True,
        "vllm_importance_sampling_mode": "token_mask",
        "vllm_importance_sampling_clip_min": 0.97,
        "vllm_importance_sampling_clip_max": 1.03,
    },
}


@pytest.fixture(scope="session")
def one_rank_runs(tmp_path_factory) -> dict[str, list[dict]]:
    """{name: [rank 0's result]} of every ONE_RANK_RUNS run."""
    return run_worker(tmp_path_factory.mktemp("vllm_one_rank"), ONE_RANK_RUNS)


@pytest.fixture(scope="session")
def two_rank_runs(tmp_path_factory) -> dict[str, list[dict]]:
    """{name: [rank 0's result, rank 1's result]} of every TWO_RANK_RUNS run."""
    return run_worker(tmp_path_factory.mktemp("vllm_two_ranks"), TWO_RANK_RUNS, ranks=2)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """A vLLM OpenAI server of the shipped chain model (fp32, both server syncs; a `LocalServer`: `.base_url`,
    `.log_path`, `.env`), for the session."""
    from tests.training.vllm.engine import chain_server

    with chain_server(tmp_path_factory.mktemp("vllm_server_log")) as server:
        yield server
