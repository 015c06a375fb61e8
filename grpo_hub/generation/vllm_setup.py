"""How TRL's `VLLMGeneration` is prepared once the trainer is built: which weight sync it runs, per mode, and (server
mode) the checks of the server and the asynchronous rollouts."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from grpo_hub.errors import field_error
from grpo_hub.generation import server, server_process
from grpo_hub.generation.adapter_sync import (
    adapter_engine,
    check_not_fsdp,
    check_servable,
    head_targets,
    install_adapter_sync,
)
from grpo_hub.generation.async_rollouts import AsyncRollouts, RolloutsCallback, sampling_params
from grpo_hub.generation.colocate import enable_cpu_weight_sync


@contextlib.contextmanager
def building_generation(use_vllm: bool, colocate_adapter: bool, server_sync: str | None, model, peft_config):
    """While TRL builds its `VLLMGeneration`: a LoRA-enabled colocate engine (`colocate_adapter`, whose refusals come
    first), grpo_hub's HTTP sync client (`server_sync`: the vllm_server_sync value in server mode, else None), and
    with `use_vllm` a one-line error naming the install where vLLM is missing (before TRL's ImportError, which names
    another package's extra)."""
    with adapter_engine(colocate_adapter, model, peft_config), server.http_sync_client(server_sync):
        if use_vllm:
            server_process.require_vllm("`use_vllm`: training with vLLM")
        yield


def prepare_colocate(generation, *, adapter_sync: bool, adapter: str | None) -> None:
    """Colocate mode: adapter-only sync of `adapter` when `adapter_sync`, else (on CPU) sync through vLLM's reload."""
    if adapter_sync:
        install_adapter_sync(generation, adapter)
    else:
        enable_cpu_weight_sync(generation)


@dataclass(frozen=True)
class ServerSettings:
    """What server mode needs of the config and the model: the requested sync ('auto', 'adapter', 'merged'), the
    folder syncs go through, k (`max_staleness`), whether training reads vLLM's log-probs, the trained adapter's name
    (None without PEFT), the model's name or path, and the completions per prompt."""

    sync: str
    sync_dir: str | None
    max_staleness: int
    reads_sampler_logprobs: bool
    adapter: str | None
    model_name: str
    num_generations: int


def prepare_vllm(
    generation, settings: ServerSettings, *, colocate_adapter: bool, add_callback, collectives, metrics
) -> AsyncRollouts | None:
    """The weight sync TRL's `VLLMGeneration` runs: colocate (`prepare_colocate`, adapter-only with
    `colocate_adapter`), or server mode with its checks and asynchronous rollouts (`prepare_server`); returns the
    rollouts (None: synchronous), whose callback `add_callback` (the trainer's) adds."""
    if generation.mode == "colocate":
        prepare_colocate(generation, adapter_sync=colocate_adapter, adapter=settings.adapter)
        return None
    rollouts = prepare_server(generation, settings, collectives=collectives, metrics=metrics)
    if rollouts is not None:
        add_callback(RolloutsCallback(rollouts))
    return rollouts


def base_weight_bytes(model) -> int:
    """Bytes of the weights a merged sync sends (every parameter but the LoRA factors)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" not in n)


def check_server(client, settings: ServerSettings, model) -> tuple[str, str]:
    """Main process: the server serves this model, with the log-probs the IS correction needs, and takes the sync
    it is given; returns the sync mode 'auto' resolves to and why. Raises one error naming the setting and the fix."""
    info = client.get_server_info()
    server.check_served_model(
        client.session.get(f"{client.base_url}/v1/models").json()["data"][0], settings.model_name
    )
    if settings.reads_sampler_logprobs:
        server.check_server_logprobs_mode(info)
    sync, why = server.choose_sync(
        settings.sync,
        has_adapter=settings.adapter is not None,
        server_device=info["device_config"]["device"],
        base_bytes=base_weight_bytes(model),
    )
    rank = model.peft_config[settings.adapter].r if settings.adapter is not None else None
    server.check_sync_support(info, client.post, sync, rank)
    return sync, why


def generation_lines(base_url: str, where: str | None, sync: str, why: str, max_staleness: int) -> list[str]:
    """What a server-mode run prints first: the server (started here, and where, or joined), the weight sync and
    why, and with max_staleness > 0 the asynchronous rollouts."""
    origin = f"started here on {where}" if where is not None else "joined: started elsewhere"
    lines = [f"generation: vLLM server at {base_url} ({origin})", f"weight sync: {sync} ({why})"]
    if max_staleness:
        lines.append(
            f"asynchronous rollouts: the server generates up to {max_staleness} batch(es) ahead "
            f"(max_staleness={max_staleness}); each step line shows the staleness and the wait for generation"
        )
    return lines


def prepare_server(generation, settings: ServerSettings, *, collectives, metrics) -> AsyncRollouts | None:
    """Server mode: check the server (before training starts), install the HTTP sync ('auto' resolved on the main
    process and broadcast), and with max_staleness > 0 the asynchronous rollouts; returns them (None for k = 0).
    `collectives` = (gather_object, broadcast_object, rank, is_main_process)."""
    gather_object, broadcast, rank, is_main = collectives
    client, model = getattr(generation, "vllm_client", None), generation.model
    decided = [None]
    if is_main:
        over_http = getattr(client, "over_http", False)  # TRL's own client ('nccl') has no HTTP sync
        sync_mode, why = (
            check_server(client, settings, model) if over_http else (server.NCCL, nccl_reason(settings.sync))
        )
        where = server_process.started_here(client.base_url)
        for line in generation_lines(client.base_url, where, sync_mode, why, settings.max_staleness):
            print(line, flush=True)
        decided = [sync_mode]
    broadcast(decided)
    sync_mode = decided[0]
    if sync_mode == server.NCCL:  # TRL's own sync runs, untouched
        if settings.max_staleness:
            field_error(
                "max_staleness",
                "asynchronous rollouts need grpo_hub's HTTP sync, but the server takes neither (TRL's NCCL sync runs).",
                f"start the server with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls {server.EXTENSION}, or set "
                "max_staleness=0.",
            )
        return None
    if sync_mode == server.ADAPTER and settings.adapter is None:
        field_error(server.FIELD, "'adapter' syncs a LoRA adapter, but the model has none.", "use 'merged'.")
    folder = sync_folder_for(client, settings.sync_dir, sync_mode) if is_main else None
    if sync_mode == server.ADAPTER:
        check_not_fsdp(generation)
        check_servable(model.peft_config[settings.adapter], head_targets(model))
        sync = server.ServerAdapterSync(
            client,
            folder,
            is_main,
            model=model,
            adapter=settings.adapter,
            gather_params=generation._dist.gather_params,
        )
    else:
        sync = server.ServerMergedSync(client, folder, is_main, named_params=generation._iter_named_params)
    generation.sync_weights = sync.sync
    generation.grpo_hub_sync = sync  # read by the trainer's logs
    if settings.max_staleness == 0:
        generation.generate = current_weights_first(generation.generate, sync, broadcast)
        return None
    rollouts = AsyncRollouts(
        client,
        max_staleness=settings.max_staleness,
        num_generations=settings.num_generations,
        sampling=sampling_params(generation),
        extra_kwargs=generation.generation_kwargs,
        collectives=collectives,
        metrics=metrics,
    )
    sync.wait_idle, sync.in_use = rollouts.wait_idle, rollouts.in_use
    rollouts.before_launch = lambda: sync.ensure_current(broadcast)
    generation.generate = rollouts.serve(current_weights_first(generation.generate, sync, broadcast))
    return rollouts


def sync_folder_for(client, sync_dir: str | None, sync_mode: str):
    """`server.sync_folder` for `client`'s server: the folder it names, and the one this process gave it if it
    started it; 'merged' needs the server's own."""
    own = server_process.own_sync_dir(client.base_url)
    return server.sync_folder(sync_dir, server.served_sync_dir(client.post), own, sync_mode == server.MERGED)


def nccl_reason(requested: str) -> str:
    """Why TRL's own NCCL sync runs (`server.syncs_over_http` decided it)."""
    if requested == server.NCCL:
        return f"{server.FIELD}='nccl', TRL's own sync"
    return "auto: the server takes no HTTP sync (no worker extension, no runtime LoRA loading) and CUDA is here, so TRL's own sync"


def current_weights_first(generate, sync, broadcast):
    """TRL's `VLLMGeneration.generate`, after re-syncing a server that restarted since the last sync."""

    def generating(*args, **kwargs):
        sync.ensure_current(broadcast)
        return generate(*args, **kwargs)

    return generating
