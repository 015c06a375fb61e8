"""How TRL's `VLLMGeneration` is prepared once the trainer is built: which weight sync it runs, per mode."""

from __future__ import annotations

from grpo_hub.generation.adapter_sync import install_adapter_sync
from grpo_hub.generation.colocate import enable_cpu_weight_sync


def prepare_vllm_generation(generation, *, adapter_sync: bool, adapter: str | None) -> None:
    """Colocate mode: adapter-only sync of `adapter` when `adapter_sync`, else (on CPU) sync through vLLM's reload."""
    if adapter_sync:
        install_adapter_sync(generation, adapter)
    else:
        enable_cpu_weight_sync(generation)
