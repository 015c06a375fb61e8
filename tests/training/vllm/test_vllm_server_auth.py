"""The guards of a grpo_hub vLLM server (grpo_hub.generation.server_auth), on the live server of the session: every
route of its route table but /health refuses a request without the token or with a wrong one, a reload from outside
the sync folder is refused, and with the token /collective_rpc calls no worker method but those a trainer calls; the
served weights stay the same (the log-probs of fixed completions)."""

import os
import re
import shutil

import pytest
import requests
import torch
from safetensors.torch import load_file, save_file

from grpo_hub.generation import server
from grpo_hub.generation.server_auth import SYNC_DIR_ENV, TOKEN_ENV, auth_headers
from grpo_hub.tasks.chain_model import chain_model_path
from tests.conftest import RUN_LIMIT_S

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
PROMPTS = ["3+4*2=", "17-9+5=", "8*7-6="]


def route_table(log: str) -> list[tuple[str, str]]:
    """(method, path) of every route the server listed when it started ("Route: /x, Methods: GET, HEAD")."""
    routes = []
    for path, methods in re.findall(r"Route: (\S+), Methods: ([A-Z, ]+)", log):
        routes += [(method.strip(), path) for method in methods.split(",")]
    return routes


def served_logprobs(base_url: str, token: str) -> list[list[float]]:
    """Greedy completions' token log-probs of PROMPTS: a change of the served weights changes them."""
    model = requests.get(f"{base_url}/v1/models", headers=auth_headers(token), timeout=RUN_LIMIT_S).json()[
        "data"
    ][0]["id"]
    payload = {"model": model, "prompt": PROMPTS, "max_tokens": 6, "temperature": 0.0, "logprobs": 0}
    answer = requests.post(
        f"{base_url}/v1/completions", json=payload, headers=auth_headers(token), timeout=RUN_LIMIT_S
    )
    assert answer.status_code == 200, answer.text
    return [choice["logprobs"]["token_logprobs"] for choice in answer.json()["choices"]]


def reload_request(path: str) -> dict:
    return {"method": server.RELOAD_METHOD, "args": [path]}


def test_every_route_but_health_refuses_a_request_without_the_right_token(vllm_server):
    base_url, token = vllm_server.base_url, vllm_server.env[TOKEN_ENV]
    routes = route_table(vllm_server.log_path.read_text())
    assert len(routes) >= 40 and ("POST", "/collective_rpc") in routes and ("POST", "/sleep") in routes
    before = served_logprobs(base_url, token)
    answered = []
    for method, path in routes:
        url = base_url + re.sub(r"\{[^}]+\}", "x", path)
        for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": f"Basic {token}"}):
            payload = reload_request("/etc/hostname") if path == "/collective_rpc" else {}
            status = requests.request(
                method, url, json=payload, headers=headers, timeout=RUN_LIMIT_S
            ).status_code
            if status != 401:
                answered.append((method, path, status))
    # the one open route is the health check: 0 routes that change the server's state answer without the token
    assert sorted(set(answered)) == [("GET", "/health", 200)], answered
    assert served_logprobs(base_url, token) == before


def test_a_reload_from_outside_the_sync_folder_is_refused(vllm_server, tmp_path):
    base_url, token = vllm_server.base_url, vllm_server.env[TOKEN_ENV]
    sync_dir = vllm_server.env[SYNC_DIR_ENV]
    asked = requests.post(f"{base_url}/collective_rpc", json={"method": server.SYNC_DIR_METHOD},
                          headers=auth_headers(token), timeout=RUN_LIMIT_S)  # fmt: skip
    assert asked.json()["results"] == [sync_dir]
    before = served_logprobs(base_url, token)
    weights = load_file(f"{chain_model_path()}/model.safetensors")
    evil = tmp_path / "evil.safetensors"
    save_file({name: torch.zeros_like(tensor) for name, tensor in weights.items()}, str(evil))
    link = f"{sync_dir}/link-{tmp_path.name}.safetensors"  # a symlink inside the folder, to a file outside it
    os.symlink(evil, link)
    try:
        for path in (str(evil), os.path.join(sync_dir, os.path.relpath(evil, sync_dir)), link):
            answer = requests.post(f"{base_url}/collective_rpc", json=reload_request(path),
                                   headers=auth_headers(token), timeout=RUN_LIMIT_S)  # fmt: skip
            assert answer.status_code != 200 and "loads weights only from" in answer.text, (path, answer.text)
    finally:
        os.unlink(link)
    assert served_logprobs(base_url, token) == before


def test_with_the_token_a_worker_method_a_trainer_does_not_call_is_refused(vllm_server, tmp_path):
    """Issue 65: vLLM's own worker methods load weights from any folder (`reload_weights`) or kill the engine
    (`save_sharded_state`); with the right token they answer 403 naming the method, and change nothing."""
    base_url, token = vllm_server.base_url, vllm_server.env[TOKEN_ENV]
    before = served_logprobs(base_url, token)
    zeroed = tmp_path / "zeroed"  # the chain model with every weight 0, outside the sync folder
    shutil.copytree(chain_model_path(), zeroed)
    weights = zeroed / "model.safetensors"
    save_file({name: torch.zeros_like(tensor) for name, tensor in load_file(weights).items()}, str(weights))
    shards = tmp_path / "shards"
    for method, kwargs in (("reload_weights", {"weights_path": str(zeroed)}), ("save_sharded_state", {"path": str(shards)}),
                           ("sleep", {})):  # fmt: skip
        answer = requests.post(f"{base_url}/collective_rpc", json={"method": method, "kwargs": kwargs},
                               headers=auth_headers(token), timeout=RUN_LIMIT_S)  # fmt: skip
        assert answer.status_code == 403 and f"not method '{method}'" in answer.text, (method, answer.text)
    assert not shards.exists()
    assert served_logprobs(base_url, token) == before
    asked = requests.post(f"{base_url}/collective_rpc", json={"method": server.SYNC_DIR_METHOD},
                          headers=auth_headers(token), timeout=RUN_LIMIT_S)  # fmt: skip
    assert asked.status_code == 200  # a method the trainer calls still runs


def test_with_the_token_a_lora_adapter_loads_only_from_inside_the_sync_folder(vllm_server, tmp_path):
    """Issue 73: vLLM's /v1/load_lora_adapter (runtime LoRA updating, on in a grpo_hub server) reads the folder its
    `lora_path` names; an adapter outside the sync folder (a path outside, a `..` escape, a symlink inside pointing
    out, a relative path) answers 403 naming the path and the folder and is never served; the same adapter inside it
    loads."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base_url, token, sync_dir = (
        vllm_server.base_url,
        vllm_server.env[TOKEN_ENV],
        vllm_server.env[SYNC_DIR_ENV],
    )
    before = served_logprobs(base_url, token)
    adapter = tmp_path / "adapter"  # a real adapter of the served model, outside the sync folder
    model = AutoModelForCausalLM.from_pretrained(chain_model_path(), dtype=torch.float32)
    get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"])).save_pretrained(adapter)
    link = f"{sync_dir}/link-{tmp_path.name}"
    os.symlink(adapter, link)

    def load(name: str, path: str):
        return requests.post(f"{base_url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path},
                             headers=auth_headers(token), timeout=RUN_LIMIT_S)  # fmt: skip

    def served() -> set[str]:
        answer = requests.get(f"{base_url}/v1/models", headers=auth_headers(token), timeout=RUN_LIMIT_S)
        return {entry["id"] for entry in answer.json()["data"]}

    try:
        escapes = (str(adapter), os.path.join(sync_dir, os.path.relpath(adapter, sync_dir)), link, "adapter")
        for k, path in enumerate(escapes):
            answer = load(f"outside-{k}", path)
            assert answer.status_code == 403, (path, answer.text)
            assert f"refused to load {path!r}" in answer.text and f"only from {sync_dir}" in answer.text, (
                answer.text
            )
        assert not any(name.startswith("outside-") for name in served())
        inside = f"{sync_dir}/adapter-{tmp_path.name}"
        shutil.copytree(adapter, inside)
        answer = load("inside", inside)
        assert answer.status_code == 200 and "inside" in served(), answer.text
        unloaded = requests.post(f"{base_url}/v1/unload_lora_adapter", json={"lora_name": "inside"},
                                 headers=auth_headers(token), timeout=RUN_LIMIT_S)  # fmt: skip
        assert unloaded.status_code == 200, unloaded.text
    finally:
        os.unlink(link)
        shutil.rmtree(f"{sync_dir}/adapter-{tmp_path.name}", ignore_errors=True)
    assert served_logprobs(base_url, token) == before
