"""Server mode without NCCL: TRL's `VLLMClient` against vLLM's own OpenAI server, weights synced over HTTP.

'nccl' keeps TRL's own sync (vLLM's weight-transfer endpoints over an NCCL group: CUDA on both sides); 'auto' keeps it
too for a server that takes neither HTTP sync when CUDA is there (`syncs_over_http`), so TRL users are unaffected.

TRL 1.16's server mode generates through `/v1/completions` (`model=client.model`) but syncs weights through an NCCL
group (`init_communicator`), which needs CUDA. Here the trainer builds `HTTPSyncClient` instead (`http_sync_client`):
the same requests, no NCCL group, and the first request answered with one error naming the setting and the fix
(`check_server`). Each sync then runs one of two modes (`vllm_server_sync`, chosen by `choose_sync`):

- 'adapter' (`ServerAdapterSync`): the trained LoRA adapter's A/B tensors only, written as a PEFT folder under
  `sync_dir` and loaded through `POST /v1/load_lora_adapter` under a fresh name, which every later request names
  (`client.model`). vLLM 0.32's endpoint takes a path on the server (`lora_path`), not bytes: `sync_dir` must be
  readable by the server at the same path (the same machine, or a shared filesystem).
- 'merged' (`ServerMergedSync`): the merged LoRA (or full) weights, from TRL's `_iter_named_params` (it merges the
  adapter, under ZeRO-3 after gathering), written as one safetensors file under `sync_dir` and reloaded in place by
  `grpo_hub.generation.worker_extension.WorkerExtension` through `POST /collective_rpc`.
Both reset the server's prefix cache: cached KV blocks were computed with the old weights.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from grpo_hub.errors import field_error
from grpo_hub.generation import server_auth
from grpo_hub.generation.adapter_sync import gathered_adapter, served_rank

FIELD = "vllm_server_sync"
ADAPTER, MERGED, AUTO, NCCL = "adapter", "merged", "auto", "nccl"
SYNC_MODES = (AUTO, ADAPTER, MERGED, NCCL)
EXTENSION = "grpo_hub.generation.worker_extension.WorkerExtension"
RELOAD_METHOD, VERSION_METHOD = "grpo_hub_reload_weights", "grpo_hub_extension_version"
CHECKPOINT_METHOD, SYNC_DIR_METHOD = "grpo_hub_reload_checkpoint", "grpo_hub_sync_dir"
# 'auto' on a GPU server: adapter-only from this many bytes of base weights (docs/vllm.md: at the Qwen2.5-0.5B shape
# a merged sync moves ~1 GB per step, seconds on a disk or a network, while vLLM's GPU LoRA kernels cost 1.1-2x per
# generated token; on CPU the LoRA path measured 3.5x slower per batch, so a CPU server always takes merged weights).
GPU_ADAPTER_BYTES = 1 << 30
SERVER_FIX = (
    "start one with `grpo-hub vllm-serve --model <model>` (docs/vllm.md), or let the recipe start it "
    "(--vllm_server_start true)"
)


def healthy(base_url: str) -> bool:
    """Whether the server at `base_url` answers /health with 200 now."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def syncs_over_http(requested: str, *, has_extension: bool, has_runtime_lora: bool, has_cuda: bool) -> bool:
    """Whether the weights go over HTTP (grpo_hub's syncs) rather than TRL's own NCCL transfer: 'auto' keeps TRL's
    sync for a server that takes neither HTTP sync when CUDA can run it (a drop-in for TRL's server mode), and goes
    over HTTP otherwise (where a server that takes neither is refused with the fix)."""
    if requested != AUTO:
        return requested != NCCL
    return has_extension or has_runtime_lora or not has_cuda


def choose_sync(requested: str, *, has_adapter: bool, server_device: str, base_bytes: int) -> tuple[str, str]:
    """(mode, why) of the sync 'auto' stands for: merged weights without an adapter or on a CPU server (vLLM's CPU
    LoRA path generates ~3.5x slower, docs/vllm.md), the adapter on a GPU server once the base weights reach
    GPU_ADAPTER_BYTES; an explicit mode is kept, with why = f"{FIELD}='{mode}'"."""
    if requested != AUTO:
        return requested, f"{FIELD}='{requested}'"
    if not has_adapter:
        return MERGED, "auto: no LoRA adapter, so the full weights"
    if server_device == "cpu":
        return MERGED, "auto: a CPU server, where vLLM's LoRA path generates ~3.5x slower"
    size = f"{base_bytes / GPU_ADAPTER_BYTES:.2f} GiB of base weights"
    if base_bytes >= GPU_ADAPTER_BYTES:
        return ADAPTER, f"auto: a GPU server and {size} (>= 1 GiB: cheaper to send the adapter only)"
    return MERGED, f"auto: a GPU server and {size} (< 1 GiB: the merged sync is cheap)"


def check_server_logprobs_mode(server_info: dict) -> None:
    """Raise where TRL only warns, when the server's log-probs are not `processed_logprobs` (call it only when
    training reads the sampler's log-probs: the IS correction or TRL's off-policy mask).

    vLLM's default `raw_logprobs` are taken before temperature (and truncation), so with temperature != 1 the
    IS ratio would compare two different distributions. `trl vllm-serve` passes `processed_logprobs` itself.
    """
    mode = server_info["model_config"]["logprobs_mode"]
    if mode != "processed_logprobs":
        field_error(
            "vllm_mode",
            f"the vLLM server returns {mode!r} log-probs (before temperature and truncation), but the trainer "
            "compares them with log-probs after temperature.",
            "restart the server with `--logprobs-mode processed_logprobs` (`trl vllm-serve` does), or set "
            "vllm_importance_sampling_correction=False and off_policy_mask_threshold=None.",
        )


def check_served_model(served: dict, trained: str) -> None:
    """Refuse a server whose model is not the trainer's: `served` is its `/v1/models` entry (id = the served name,
    root = the path or Hub id it loaded), compared by their last path part with the trainer's `_name_or_path`."""
    names = {Path(str(served.get(key) or "")).name for key in ("id", "root")}
    if Path(trained).name not in names:
        field_error(
            "vllm_server_base_url",
            f"the server serves {served.get('id')!r}, but the trainer trains {trained!r}.",
            f"start the server with --model {trained} (or --served-model-name {Path(trained).name} when the same "
            "weights live under another path), or point vllm_server_base_url at the right server.",
        )


def check_sync_support(server_info: dict, probe, sync: str, adapter_rank: int | None) -> None:
    """Refuse a server that cannot take `sync` before training starts. `probe(path, payload)` POSTs and returns
    (status, body): the adapter path needs LoRA with a rank bound >= the adapter's and runtime LoRA updating, the
    merged path grpo_hub's worker extension."""
    if sync == ADAPTER:
        lora = server_info.get("lora_config")
        needed = served_rank(adapter_rank, None)
        if lora is None or lora["max_lora_rank"] < needed:
            field_error(
                FIELD,
                f"'adapter' needs a server with LoRA enabled for rank {adapter_rank}, but it has "
                f"{'no LoRA' if lora is None else 'max_lora_rank ' + str(lora['max_lora_rank'])}.",
                f"restart it with --enable-lora --max-lora-rank {needed}, or set {FIELD}='merged'.",
            )
        status, body = lora_route_probe(probe)
        if status == 404 and "error" not in body:  # the route itself is missing: {"detail": "Not Found"}
            field_error(
                FIELD,
                "'adapter' loads each adapter at run time, but the server has no /v1/load_lora_adapter.",
                f"restart it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment, or set {FIELD}='merged'.",
            )
    else:
        status, body = probe("/collective_rpc", {"method": VERSION_METHOD})
        if status != 200:
            field_error(
                FIELD,
                f"'merged' reloads the weights through grpo_hub's worker extension, but the server answered "
                f"{status} ({str(body)[:160]}).",
                f"restart it with VLLM_SERVER_DEV_MODE=1 in its environment and --worker-extension-cls {EXTENSION} "
                "(grpo_hub installed where it runs), or use a LoRA adapter with vllm_server_sync='adapter'.",
            )


def check_authorized(response, token: str | None) -> None:
    """A 401 from the server is one line naming the token's setting: the server guards its routes
    (`server_auth.TokenMiddleware`) and the trainer sent no token, or another one."""
    if response.status_code == 401:
        sent = "sent no token" if token is None else "sent a token the server does not take"
        field_error(
            server_auth.TOKEN_ENV,
            f"the vLLM server refused {response.request.method} {response.url} (401 Unauthorized): the trainer {sent}.",
            server_auth.TOKEN_FIX + ".",
        )


def make_http_sync_client(requested: str, token: str | None):
    """`HTTPSyncClient`: TRL's `VLLMClient` (vLLM is imported with it) that sends the server's `token` with every
    request and opens TRL's NCCL group only where `syncs_over_http` says TRL's sync runs (its `over_http`). `requests`
    is imported where a request is made: a trainer refused before it reaches the server (no vLLM) never needs it."""
    from trl.generation.vllm_client import VLLMClient

    class HTTPSyncClient(VLLMClient):
        """TRL's client for vLLM's OpenAI server; weights go over HTTP (`ServerAdapterSync`, `ServerMergedSync`)."""

        over_http = True

        @property
        def session(self):
            return self._session

        @session.setter
        def session(self, session):
            """TRL's retrying session (set first thing in its `__init__`), carrying the token to every request."""
            session.headers.update(server_auth.auth_headers(token))
            session.hooks["response"].append(
                lambda response, *args, **kwargs: check_authorized(response, token)
            )
            self._session = session

        def check_server(self, total_timeout: float = 0.0, retry_interval: float = 2.0):
            """TRL's wait for /health, which says nothing while it waits: here one line first says what for."""
            import requests

            if not healthy(self.base_url):
                print(
                    f"waiting up to {total_timeout:g} s for a vLLM server to answer {self.base_url}/health "
                    f"(vllm_server_timeout); {SERVER_FIX}",
                    flush=True,
                )
            try:
                super().check_server(total_timeout, retry_interval)
            except (ConnectionError, requests.exceptions.ConnectionError):  # TRL raises the latter
                field_error(
                    "vllm_server_base_url",
                    f"no vLLM server answered at {self.base_url}/health within vllm_server_timeout={total_timeout} s.",
                    f"{SERVER_FIX}; or raise vllm_server_timeout while it starts.",
                )

        def init_communicator(self, device=0):
            """No NCCL group when the weights go over HTTP; TRL's group otherwise (`syncs_over_http`)."""
            import torch

            has_extension = self.post("/collective_rpc", {"method": VERSION_METHOD})[0] == 200
            status, body = lora_route_probe(self.post)
            has_runtime_lora = (
                status == 404 and "error" in body
            )  # "No adapter found": the route and LoRA work
            self.over_http = syncs_over_http(
                requested, has_extension=has_extension, has_runtime_lora=has_runtime_lora,
                has_cuda=torch.cuda.is_available(),
            )  # fmt: skip
            if not self.over_http:
                super().init_communicator(device)

        def post(self, path: str, payload: dict) -> tuple[int, dict]:
            """(status, JSON body) of a POST to the server."""
            import requests

            # not the client's retrying session: a 500 here is an answer (e.g. LoRA off), and a reload is not retried
            response = requests.post(
                f"{self.base_url}{path}", json=payload, timeout=600, headers=server_auth.auth_headers(token)
            )
            check_authorized(response, token)
            try:
                return response.status_code, response.json()
            except ValueError:
                return response.status_code, {"text": response.text}

        def call(self, path: str, payload: dict) -> dict:
            """POST that must succeed; a failure names the endpoint and the server's answer."""
            status, body = self.post(path, payload)
            if status != 200:
                raise RuntimeError(f"vLLM server {self.base_url}{path} answered {status}: {body}")
            return body

    return HTTPSyncClient


@contextlib.contextmanager
def http_sync_client(requested: str | None):
    """While TRL's `VLLMGeneration` is built in server mode (`requested`: the vllm_server_sync value; None: not server
    mode), it builds `HTTPSyncClient` instead of `VLLMClient`, except for 'nccl' without a token (TRL's own client,
    untouched; with a token, `HTTPSyncClient` carries it and runs TRL's NCCL sync)."""
    token = server_auth.client_token() if requested is not None else None
    if requested is None or (requested == NCCL and token is None):
        yield
        return
    from trl.generation import vllm_generation

    original = vllm_generation.VLLMClient
    vllm_generation.VLLMClient = make_http_sync_client(requested, token)
    try:
        yield
    finally:
        vllm_generation.VLLMClient = original


def served_sync_dir(post) -> str | None:
    """The sync folder the server's worker extension loads weights from (fixed at its start), asked with
    `post(path, payload) -> (status, body)`; None when the server has no such folder or no extension."""
    status, body = post("/collective_rpc", {"method": SYNC_DIR_METHOD})
    return body["results"][0] if status == 200 else None


def lora_route_probe(post) -> tuple[int, dict]:
    """(status, body) of loading an adapter that is not there through `/v1/load_lora_adapter`: 404 with an error
    ("No adapter found") where the route and LoRA work, 404 {"detail": "Not Found"} where runtime LoRA updating is
    off. The path lies inside the server's sync folder where it has one (`served_sync_dir`): a grpo_hub server refuses
    any other (`server_auth.lora_path_inside`)."""
    folder = served_sync_dir(post)
    path = str(Path(folder) / "grpo-hub-probe-absent") if folder else "/nonexistent"
    return post("/v1/load_lora_adapter", {"lora_name": "grpo-hub-probe", "lora_path": path})


def sync_folder(
    sync_dir: str | None, served: str | None, own: str | None = None, needs_served: bool = False
) -> Path:
    """The folder syncs are written to, owner-only (`server_auth.private_folder`): one the trainer agreed to, never one
    a server merely names (a server that is not this run's, or anyone in the middle of plain HTTP, would choose the
    folder the trainer makes owner-only and fills with weights). `sync_dir` (the user's vllm_server_sync_dir), else
    `own` (the folder this process gave the server it started), must be the server's folder `served` where it has one;
    with neither and no `served`, a fresh temporary folder on this machine, removed at exit. `needs_served` ('merged'
    reloads only from the server's own folder): a server without one is an error."""
    if needs_served and served is None:
        field_error(
            FIELD,
            "'merged' reloads weights only from the server's sync folder, fixed when it starts, and this server has "
            "none.",
            f"start it with `grpo-hub vllm-serve` (which fixes one), or with {server_auth.SYNC_DIR_ENV} in its "
            "environment.",
        )
    agreed = sync_dir or own
    if served is not None and agreed is None:
        field_error(
            "vllm_server_sync_dir",
            f"the server names {served!r} as its sync folder, which this run did not choose: the trainer would make "
            "it owner-only and write the weights there.",
            f"if that server is yours, set vllm_server_sync_dir={served!r} (the --sync-dir `grpo-hub vllm-serve` "
            "printed); or let the recipe start its own server (--vllm_server_start true).",
        )
    if served is not None and Path(agreed).resolve() != Path(served):
        field_error(
            "vllm_server_sync_dir",
            f"{agreed!r}, but the server loads weights only from its sync folder {served!r}.",
            f"start the server with --sync-dir {agreed}, or point vllm_server_base_url at the server started with it.",
        )
    if agreed is None:
        return Path(server_auth.temporary_sync_folder())
    return server_auth.private_folder(agreed)


def write_atomically(target: Path, write) -> None:
    """`write(staging)` into a sibling, make it owner-only (files 0600, a folder 0700), then rename it to `target`:
    the server never reads a half-written sync."""
    staging = target.with_name(f".{target.name}.partial")
    write(staging)
    for path in [staging, *staging.glob("*")]:
        path.chmod(0o700 if path.is_dir() else 0o600)
    os.replace(staging, target)


class ServerSync:
    """What both sync modes share: the client (main process only; None elsewhere), the folder, the count of syncs,
    the bytes and seconds of the last one, and `wait_idle`, called before weights change under running requests."""

    def __init__(self, client, folder: Path, is_main_process: bool):
        self.client, self.folder, self.is_main = client, folder, is_main_process
        self.syncs, self.bytes_last_sync, self.seconds_last_sync = 0, 0, 0.0
        self.instance = None  # the vLLM instance the last sync reached (a restarted server is another one)
        self.wait_idle = lambda: None  # set by the asynchronous rollouts

    def sync(self) -> None:
        start = time.perf_counter()
        tensors = self.collect()  # every rank: the gathers are collectives
        self.syncs += 1
        self.bytes_last_sync = sum(t.numel() * t.element_size() for t in tensors.values())
        if self.is_main:
            self.send(tensors)
            self.client.reset_prefix_cache()
            self.instance = self.client.get_server_info()["instance_id"]
        self.seconds_last_sync = time.perf_counter() - start

    def ensure_current(self, broadcast) -> None:
        """Before generating: a server restarted since the last sync serves its checkpoint, not the trainer's
        weights, so sync again (every rank calls this; the main process asks the server and broadcasts)."""
        restarted = [
            self.is_main and self.syncs > 0 and self.client.get_server_info()["instance_id"] != self.instance
        ]
        broadcast(restarted)
        if restarted[0]:
            self.forget_served()
            self.sync()

    def forget_served(self) -> None:
        """What the previous server instance held is gone with it."""


class ServerAdapterSync(ServerSync):
    """'adapter': the trained adapter, loaded under a fresh name; adapters no running request names are unloaded."""

    mode = ADAPTER

    def __init__(self, client, folder, is_main_process, *, model, adapter: str, gather_params):
        super().__init__(client, folder, is_main_process)
        self.model, self.adapter, self.gather_params = model, adapter, gather_params
        self.config = model.peft_config[adapter]
        self.run_id = uuid.uuid4().hex[:8]
        self.loaded: list[str] = []  # names the server holds, oldest first
        self.in_use = lambda: set()  # names running requests still generate with (asynchronous rollouts)

    def collect(self) -> dict:
        return gathered_adapter(self.model, self.adapter, self.gather_params)

    def restore_checkpoint(self) -> None:
        """The adapter applies to the server's checkpoint weights: reload them where grpo_hub's worker extension can
        (only it changes a server's weights in place, so a server without it holds its checkpoint)."""
        status, body = self.client.post("/collective_rpc", {"method": CHECKPOINT_METHOD})
        if status == 200:
            return
        if "has no attribute" not in str(body) and status != 404:
            raise RuntimeError(
                f"vLLM server {self.client.base_url}: reloading its checkpoint answered {status}: {body}"
            )

    def forget_served(self) -> None:
        for name in self.loaded:
            _remove_tree(self.folder / name)
        self.loaded = []

    def send(self, tensors: dict) -> None:
        from safetensors.torch import save_file

        name = f"{self.adapter}-{self.run_id}-sync{self.syncs}"  # fresh on a server other runs may have used
        config = {**self.config.to_dict(), "target_modules": sorted(self.config.target_modules)}

        def write(folder: Path) -> None:
            folder.mkdir()
            save_file(
                {k: v.contiguous() for k, v in tensors.items()}, str(folder / "adapter_model.safetensors")
            )
            (folder / "adapter_config.json").write_text(json.dumps(config, default=str))

        write_atomically(self.folder / name, write)
        if (
            not self.loaded
        ):  # first sync to this server: its base weights may hold an earlier run's merged sync
            self.restore_checkpoint()
        self.client.call(
            "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str((self.folder / name).absolute())}
        )
        self.client.model = name  # every later request generates with it
        self.loaded.append(name)
        busy = self.in_use()
        for old in [n for n in self.loaded[:-1] if n not in busy]:
            self.client.call("/v1/unload_lora_adapter", {"lora_name": old})
            self.loaded.remove(old)
            _remove_tree(self.folder / old)


class ServerMergedSync(ServerSync):
    """'merged': the merged (or full) weights in one safetensors file, reloaded in place by the worker extension,
    once no request is running (`wait_idle`): vLLM swaps the weights under every request it is serving."""

    mode = MERGED

    def __init__(self, client, folder, is_main_process, *, named_params):
        super().__init__(client, folder, is_main_process)
        self.named_params = named_params  # TRL's `VLLMGeneration._iter_named_params`

    def collect(self) -> dict:
        # copies: TRL unmerges the adapter in place once the iteration ends
        return {name: param.detach().to("cpu", copy=True).contiguous() for name, param in self.named_params()}

    def send(self, tensors: dict) -> None:
        from safetensors.torch import save_file

        target = self.folder / "weights.safetensors"
        write_atomically(target, lambda staging: save_file(tensors, str(staging)))
        self.wait_idle()
        self.client.call("/collective_rpc", {"method": RELOAD_METHOD, "args": [str(target)]})


def _remove_tree(folder: Path) -> None:
    for path in folder.glob("*"):
        path.unlink()
    folder.rmdir()
