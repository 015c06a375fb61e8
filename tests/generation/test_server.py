"""Server-mode rules without a server: which sync 'auto' picks, and the preflight refusals, each naming the setting
and the fix (the real server: tests/training/vllm/test_vllm_server.py)."""

import pytest

from grpo_hub.generation import server

GIB = 1 << 30
WITH_LORA = {"lora_config": {"max_lora_rank": 16}}


@pytest.mark.parametrize(("requested", "has_adapter", "device", "size", "chosen"), [
    ("auto", False, "cuda", 10 * GIB, "merged"),  # nothing to send but the weights
    ("auto", True, "cpu", 10 * GIB, "merged"),  # vLLM's CPU LoRA path generates ~3.5x slower
    ("auto", True, "cuda", GIB // 2, "merged"),  # small: the merged sync is cheap
    ("auto", True, "cuda", GIB, "adapter"),
    ("adapter", True, "cpu", 1, "adapter"),  # an explicit mode is kept
    ("merged", True, "cuda", 10 * GIB, "merged"),
])  # fmt: skip
def test_auto_picks_by_device_and_weight_bytes(requested, has_adapter, device, size, chosen):
    assert (
        server.choose_sync(requested, has_adapter=has_adapter, server_device=device, base_bytes=size)
        == chosen
    )


def test_the_served_model_must_be_the_trained_one():
    server.check_served_model(
        {"id": "/srv/models/chain-model", "root": "/srv/models/chain-model"}, "/a/chain-model"
    )
    server.check_served_model({"id": "chain-model", "root": "/x/y"}, "org/chain-model")  # --served-model-name
    with pytest.raises(
        ValueError, match=r"^`vllm_server_base_url`: the server serves 'Qwen/Qwen2.5-0.5B'.*Fix:"
    ):
        server.check_served_model({"id": "Qwen/Qwen2.5-0.5B", "root": "Qwen/Qwen2.5-0.5B"}, "/a/chain-model")


def test_a_server_with_other_logprobs_is_refused():
    server.check_server_logprobs_mode({"model_config": {"logprobs_mode": "processed_logprobs"}})
    with pytest.raises(ValueError, match="`vllm_mode`.*raw_logprobs.*--logprobs-mode processed_logprobs"):
        server.check_server_logprobs_mode({"model_config": {"logprobs_mode": "raw_logprobs"}})


def answering(status: int, body: dict):
    """A probe that answers every POST with `status` and `body`, recording the paths."""
    paths = []

    def probe(path, payload):
        paths.append(path)
        return status, body

    probe.paths = paths
    return probe


ADAPTER_ROUTE_PRESENT = (404, {"error": {"message": "No adapter found for /nonexistent", "code": 404}})


def test_adapter_sync_needs_lora_with_room_for_the_rank_and_runtime_updates():
    server.check_sync_support(WITH_LORA, answering(*ADAPTER_ROUTE_PRESENT), "adapter", 16)
    with pytest.raises(ValueError, match=r"`vllm_server_sync`: 'adapter' needs .* no LoRA.*--enable-lora"):
        server.check_sync_support({"lora_config": None}, answering(*ADAPTER_ROUTE_PRESENT), "adapter", 16)
    with pytest.raises(ValueError, match=r"max_lora_rank 16.*--max-lora-rank 32"):
        server.check_sync_support(WITH_LORA, answering(*ADAPTER_ROUTE_PRESENT), "adapter", 32)
    with pytest.raises(
        ValueError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True.*Fix:|Fix:.*VLLM_ALLOW_RUNTIME_LORA"
    ):
        server.check_sync_support(WITH_LORA, answering(404, {"detail": "Not Found"}), "adapter", 16)


def test_merged_sync_needs_the_worker_extension():
    probe = answering(200, {"results": [1]})
    server.check_sync_support({}, probe, "merged", None)
    assert probe.paths == ["/collective_rpc"]
    for status, body in (
        (404, {"detail": "Not Found"}),
        (500, {"error": "'CPUWorker' object has no attribute"}),
    ):
        with pytest.raises(
            ValueError, match=rf"`vllm_server_sync`: 'merged'.*{status}.*VLLM_SERVER_DEV_MODE=1"
        ):
            server.check_sync_support({}, answering(status, body), "merged", None)


@pytest.mark.parametrize(
    "given", [{"multi_turn": True, "is_vlm": False}, {"multi_turn": False, "is_vlm": True}]
)
def test_async_rollouts_refuse_turn_by_turn_and_image_rollouts(tmp_path, given):
    from grpo_hub.training.input_checks import check_trainer_options
    from tests.helpers import tiny_config

    args = tiny_config(tmp_path, use_vllm=True, vllm_mode="server", max_staleness=1)
    with pytest.raises(ValueError, match=r"^`max_staleness`: .*turn by turn.*Fix: set max_staleness=0"):
        check_trainer_options(args, **given, has_reference=False, datasets={})
    check_trainer_options(tiny_config(tmp_path, use_vllm=True, vllm_mode="server"), **given, has_reference=False,
                          datasets={})  # fmt: skip


@pytest.mark.parametrize(("requested", "extension", "lora", "cuda", "http"), [
    ("auto", False, False, True, False),  # a plain server on GPUs: TRL's own NCCL sync, as without grpo_hub
    ("auto", True, False, True, True),  # grpo_hub's worker extension: merged weights over HTTP
    ("auto", False, True, True, True),  # runtime LoRA loading: the adapter over HTTP
    ("auto", False, False, False, True),  # no CUDA, no NCCL: over HTTP, where the missing support is refused
    ("merged", False, False, True, True),
    ("adapter", False, False, True, True),
    ("nccl", True, True, True, False),
])  # fmt: skip
def test_auto_keeps_trls_nccl_sync_for_a_server_that_takes_no_http_sync(
    requested, extension, lora, cuda, http
):
    assert (
        server.syncs_over_http(requested, has_extension=extension, has_runtime_lora=lora, has_cuda=cuda)
        is http
    )
