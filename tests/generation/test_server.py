"""Server-mode rules without a server: which sync 'auto' picks, and the preflight refusals, each naming the setting
and the fix (the real server: tests/training/vllm/test_vllm_server.py)."""

import sys

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
    mode, why = server.choose_sync(requested, has_adapter=has_adapter, server_device=device, base_bytes=size)
    assert mode == chosen
    assert why.startswith("auto: ") if requested == "auto" else why == f"vllm_server_sync='{requested}'"


def test_auto_says_why_it_picked():
    def why(has_adapter, device, size):
        return server.choose_sync("auto", has_adapter=has_adapter, server_device=device, base_bytes=size)[1]

    assert why(False, "cuda", GIB) == "auto: no LoRA adapter, so the full weights"
    assert "a CPU server" in why(True, "cpu", 10 * GIB)
    assert "2.00 GiB of base weights (>= 1 GiB" in why(True, "cuda", 2 * GIB)
    assert "0.50 GiB of base weights (< 1 GiB" in why(True, "cuda", GIB // 2)


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


def test_waiting_for_a_server_says_at_once_what_for_and_how_long(capsys):
    from tests.conftest import free_port

    client_class = server.make_http_sync_client("auto", None)
    client = client_class.__new__(client_class)  # TRL's __init__ would wait for the server itself
    client.base_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ValueError, match="^`vllm_server_base_url`: no vLLM server answered"):
        client.check_server(total_timeout=0.5, retry_interval=0.1)
    assert capsys.readouterr().out.startswith(
        f"waiting up to 0.5 s for a vLLM server to answer {client.base_url}/health (vllm_server_timeout); start one"
    )


def test_the_first_lines_name_the_server_the_sync_and_why():
    from grpo_hub.generation.vllm_setup import generation_lines, nccl_reason

    started = generation_lines("http://127.0.0.1:8000", "cores 1", "merged", "auto: a CPU server, ...", 1)
    assert started[:2] == [
        "generation: vLLM server at http://127.0.0.1:8000 (started here on cores 1)",
        "weight sync: merged (auto: a CPU server, ...)",
    ]
    assert "max_staleness=1" in started[2] and "staleness and the wait for generation" in started[2]
    joined = generation_lines("http://gen:8000", None, "nccl", nccl_reason("auto"), 0)
    assert (
        joined[0] == "generation: vLLM server at http://gen:8000 (joined: started elsewhere)"
        and len(joined) == 2
    )
    assert "CUDA is here, so TRL's own sync" in joined[1]
    assert nccl_reason("nccl") == "vllm_server_sync='nccl', TRL's own sync"


def test_merged_syncs_need_the_servers_own_sync_folder(tmp_path):
    """'merged' reloads only from the folder the server fixed at its start: a server without one is refused, naming
    the field; with one, the folder the run agreed to is the folder."""
    with pytest.raises(
        ValueError, match=r"`vllm_server_sync`: 'merged' reloads weights only from the server's sync"
    ):
        server.sync_folder(str(tmp_path), None, needs_served=True)
    assert server.sync_folder(str(tmp_path), str(tmp_path.resolve()), needs_served=True) == tmp_path.resolve()


def test_without_vllm_or_requests_use_vllm_is_still_the_one_line(tmp_path, monkeypatch):
    """Issue 73: `requests` (the server client's) is imported only where a request is made, so a trainer refused
    before it reaches a server (here: no vLLM) says the one line, not a traceback, on a machine without requests."""
    import importlib.util

    from grpo_hub.training.trainer import GRPOHubTrainer
    from tests.helpers import tiny_config

    monkeypatch.setitem(sys.modules, "requests", None)  # `import requests` now raises ModuleNotFoundError
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    args = tiny_config(tmp_path, use_vllm=True, vllm_mode="server")
    with pytest.raises(ValueError, match=r"^`use_vllm`: training with vLLM needs vLLM.*Fix: pip install"):
        GRPOHubTrainer("unused: refused before the model loads", reward_funcs=[len], args=args)
    with server.http_sync_client("auto"):  # the client class itself is built without requests
        from trl.generation import vllm_generation

        assert vllm_generation.VLLMClient.over_http
