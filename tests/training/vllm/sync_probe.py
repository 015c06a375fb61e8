"""Probe of a colocate engine after every weight sync (run inside the vLLM environment by colocate_worker.py).

After each `sync_weights` the engine scores FIXED token sequences (prompt log-probs, temperature 1) and the trainer's
model scores the same ones in fp32: what the engine serves is compared with what the trainer holds, sync by sync,
whichever sync (TRL's merged one through grpo_hub's CPU reload, or `vllm_adapter_sync`) is installed. The params
that sync asks to gather are recorded too.
"""

from __future__ import annotations

import torch

SEQUENCES, LENGTH = 4, 24


def fixed_sequences(vocab_size: int) -> list[list[int]]:
    """SEQUENCES token sequences of LENGTH drawn once from a fixed generator (no special tokens: ids >= 3)."""
    generator = torch.Generator().manual_seed(1234)
    return torch.randint(3, vocab_size, (SEQUENCES, LENGTH), generator=generator).tolist()


def engine_logps(llm, sequences, generate=None) -> torch.Tensor:
    """[SEQUENCES, LENGTH - 1] log-probs of each next token as the engine serves them through `generate` (default
    `llm.generate`, the one TRL calls: with the synced adapter, if any)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    outputs = (generate or llm.generate)(
        [{"prompt_token_ids": ids} for ids in sequences], params, use_tqdm=False
    )
    return torch.tensor(
        [
            [out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))]
            for out, ids in zip(outputs, sequences, strict=True)
        ]
    )


@torch.no_grad()
def trainer_logps(model, sequences) -> torch.Tensor:
    ids = torch.tensor(sequences)
    logps = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), dim=-1)
    return logps.gather(-1, ids[:, 1:, None]).squeeze(-1)


def merged_logps(generation, sequences) -> torch.Tensor:
    """The same weights served merged by the same engine: TRL's merge -> grpo_hub's CPU reload -> unmerge, scored
    without an adapter; then the engine's base weights are reloaded from the checkpoint (the reload also drops the
    engine's adapters, so the caller syncs again)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    from grpo_hub.generation.colocate import _reload_weights

    _reload_weights(generation)
    served = engine_logps(generation.llm, sequences, type(generation.llm).generate.__get__(generation.llm))
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(is_checkpoint_format=True)  # from the checkpoint on disk: the base weights
    for module in runner.model.modules():
        if isinstance(module, VocabParallelEmbedding):
            module.quant_method.process_weights_after_loading(module)
    generation.llm.reset_prefix_cache()
    return served


def install_probe(trainer, compare_merged: bool = False) -> dict:
    """Wrap the trainer's engine sync: after each one record the engine-vs-trainer mean |Δ log p| on the fixed
    sequences, the engine's log-probs, and how many parameters the sync gathered (of how many adapter tensors).
    `compare_merged` (with `vllm_adapter_sync`): also serve the same weights merged by the same engine."""
    generation = trainer.vllm_generation
    sequences = fixed_sequences(trainer.model.config.vocab_size)
    lora = [
        name
        for name, _ in trainer.model.named_parameters()
        if ".lora_A.default." in name or ".lora_B.default." in name
    ]
    record = {"abs_logp_diff": [], "engine_logps": [], "gathered": [], "adapter_tensors": len(lora)}
    sync, gather = generation.sync_weights, generation._dist.gather_params

    def counting_gather(params):
        record["gathered"].append(len(params))
        return gather(params)

    adapter_sync = getattr(sync, "__self__", None)
    if adapter_sync is not None and hasattr(adapter_sync, "gather_params"):
        adapter_sync.gather_params = counting_gather

    def probed_sync():
        sync()
        served, trained = engine_logps(generation.llm, sequences), trainer_logps(trainer.model, sequences)
        record["abs_logp_diff"].append((served - trained).abs().mean().item())
        record["engine_logps"].append(served.tolist())
        if compare_merged:
            merged = merged_logps(generation, sequences)
            record.setdefault("merged_abs_logp_diff", []).append((merged - trained).abs().mean().item())
            sync()  # the adapter again, into the restored base weights

    generation.sync_weights = probed_sync
    return record
