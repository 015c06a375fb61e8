"""vLLM colocate weight sync of a LoRA adapter: TRL's merged sync vs grpo_hub's `vllm_adapter_sync`, in one process.

TRL 1.16 merges the adapter into the base weights, pushes every base weight into the engine and unmerges (on vLLM's
CPU backend through grpo_hub's `reload_weights` route, the only one that works there); `vllm_adapter_sync` hands the
engine the adapter's lora_A / lora_B tensors only and generates with that adapter (an engine built with LoRA on).
The two modes train alternately in this one process (each run builds its trainer and engine; the order rotates per
repetition), on the same weights, data and seed, LoRA r=16 on every linear layer. Per optimizer step (the first
step of each run is left out: engine warm-up):
  sync s / bytes / peak MiB  wall time of the engine sync; bytes of the tensors handed to the engine (merged: every
                             base weight `_iter_named_params` yields, after the merge; adapter: the A/B tensors);
                             peak resident memory during the sync above the resident memory before it
  gen s, tokens, ms/token    wall time of the engine's `generate` calls of the step, completion tokens, ms per token
  step s                     wall time of the whole optimizer step (sync + generation + scoring + loss + update)
Models: the chain task's pretrained model (`grpo_hub.tasks.chain_model`, chain prompts) and a Qwen2.5-0.5B-shaped
model with Qwen's vocabulary and random weights (`benchmarks.qwen_vocab`; digits prompts, 0 learning rate so the
weights stay finite). Run in the vLLM environment, pinned to one core:

    taskset -c 1 env OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=. \\
        /opt/vllm-env/bin/python -m benchmarks.engines.vllm_lora_sync --model chain --steps 5 --repeats 2
    (--model qwen2.5-0.5b: ~2 GB of random weights are written to a temporary folder first; use --repeats 1 there:
    vLLM 0.32 does not give back a finished run's engine memory in-process, and a fourth 0.5B run exceeds 24 GB)
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager

import torch
from peft import LoraConfig
from transformers import TrainerCallback

from benchmarks.common import QUIET_CPU_RUN, QWEN25_05B_CONFIG, random_model
from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.generation.colocate import enable_cpu_weight_sync
from grpo_hub.tasks import chain_model_path, get_reward_funcs, load_task_dataset

# merged = TRL's sync; merged-lora-engine = TRL's sync into the engine built for LoRA (no adapter served), which
# separates what the LoRA engine costs from what the sync saves; adapter = vllm_adapter_sync.
MODES = {
    "merged": {},
    "merged-lora-engine": {"vllm_adapter_sync": True},
    "adapter": {"vllm_adapter_sync": True},
}
MODELS = {  # model -> (task, per-device batch, max completion tokens, learning rate, engine context length)
    "chain": ("chain", 16, 48, 1e-3, 96),
    "qwen2.5-0.5b": ("digits", 8, 32, 0.0, 256),
}
MIB = 2**20


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def peak_rss_above_start(record: list):
    """Append the peak resident memory above the starting one (sampled every millisecond) while the block runs."""
    start, peak, done = resident_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], resident_bytes())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
        record.append(max(peak[0], resident_bytes()) - start)


class EngineMeter(TrainerCallback):
    """Per optimizer step: sync seconds, bytes and peak memory; generate seconds and completion tokens; step seconds."""

    KEYS = ("sync_s", "sync_bytes", "sync_peak", "gen_s", "gen_tokens", "step_s")

    def __init__(self, generation):
        self.steps, self.current, self.started = [], dict.fromkeys(self.KEYS, 0), 0.0
        self._wrap_sync(generation)
        self._wrap_generate(generation.llm)

    def _wrap_sync(self, generation):
        sync, iterate = generation.sync_weights, generation._iter_named_params
        adapter_sync = getattr(sync, "__self__", None)  # vllm_adapter_sync's AdapterSync, else None

        def counted_params():  # the merged path: every tensor handed to the engine
            for name, tensor in iterate():
                self.current["sync_bytes"] += tensor.numel() * tensor.element_size()
                yield name, tensor

        def timed_sync():
            peaks = []
            start = time.perf_counter()
            with peak_rss_above_start(peaks):
                sync()
            self.current["sync_s"] += time.perf_counter() - start
            self.current["sync_peak"] = max(self.current["sync_peak"], peaks[0])
            if adapter_sync is not None:
                self.current["sync_bytes"] += adapter_sync.bytes_last_sync

        generation._iter_named_params = counted_params
        generation.sync_weights = timed_sync

    def _wrap_generate(self, llm):
        generate = llm.generate

        def timed_generate(*args, **kwargs):
            start = time.perf_counter()
            outputs = generate(*args, **kwargs)
            self.current["gen_s"] += time.perf_counter() - start
            self.current["gen_tokens"] += sum(len(o.token_ids) for out in outputs for o in out.outputs)
            return outputs

        llm.generate = timed_generate

    def on_step_begin(self, args, state, control, **kwargs):
        self.current, self.started = dict.fromkeys(self.KEYS, 0), time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.current["step_s"] = time.perf_counter() - self.started
        self.steps.append(self.current)


def model_folder(name: str, folder: str) -> str:
    """The chain model's folder, or a Qwen2.5-0.5B-shaped random model (fp32) with Qwen's vocabulary in `folder`."""
    if name == "chain":
        return chain_model_path()
    from benchmarks.qwen_vocab import load_qwen_tokenizer

    tokenizer = load_qwen_tokenizer()
    random_model(tokenizer, {**QWEN25_05B_CONFIG, "max_position_embeddings": 512}).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run(mode: str, model_dir: str, model: str, steps: int, out_dir: str) -> list[dict]:
    """Train `steps` steps in `mode`; the per-step measurements of steps 2..steps."""
    task, batch, completion, learning_rate, context = MODELS[model]
    args = GRPOHubConfig(
        output_dir=out_dir,
        **QUIET_CPU_RUN,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=context,
        per_device_train_batch_size=batch,
        num_generations=4,
        max_completion_length=completion,
        learning_rate=learning_rate,
        max_steps=steps,
        seed=0,
        **MODES[mode],
    )
    trainer = GRPOHubTrainer(
        model=model_dir,
        reward_funcs=get_reward_funcs(task),
        args=args,
        train_dataset=load_task_dataset(task, n=batch * steps, seed=0),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0),
    )
    if (
        mode == "merged-lora-engine"
    ):  # back to TRL's merged sync (grpo_hub's CPU reload) and adapter-free generation
        enable_cpu_weight_sync(trainer.vllm_generation)
        del trainer.vllm_generation.llm.generate
    meter = EngineMeter(trainer.vllm_generation)
    trainer.add_callback(meter)
    trainer.train()
    del trainer
    gc.collect()
    return meter.steps[1:]


def median(rows: list[dict], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def report(results: dict[str, list[dict]]) -> None:
    figures = {
        "sync s / step": lambda rows: median(rows, "sync_s"),
        "bytes / sync (MiB)": lambda rows: median(rows, "sync_bytes") / MIB,
        "peak memory during sync (MiB above start)": lambda rows: median(rows, "sync_peak") / MIB,
        "generation s / step": lambda rows: median(rows, "gen_s"),
        "completion tokens / step": lambda rows: median(rows, "gen_tokens"),
        "generation ms / token": lambda rows: (
            1e3 * median(rows, "gen_s") / max(median(rows, "gen_tokens"), 1)
        ),
        "whole step s": lambda rows: median(rows, "step_s"),
    }
    merged, lora_engine, adapter = (results[mode] for mode in MODES)
    print("steps measured (medians): " + ", ".join(f"{mode} {len(rows)}" for mode, rows in results.items()))
    print(
        "| figure | TRL merged sync | merged, LoRA engine | vllm_adapter_sync | adapter / merged | "
        "adapter / merged, LoRA engine |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, figure in figures.items():
        a, e, b = figure(merged), figure(lora_engine), figure(adapter)
        print(
            f"| {name} | {a:.4g} | {e:.4g} | {b:.4g} | {b / a if a else float('nan'):.4f} | "
            f"{b / e if e else float('nan'):.4f} |"
        )
    for mode, rows in results.items():
        rest = median(rows, "step_s") - median(rows, "sync_s") - median(rows, "gen_s")
        print(f"{mode}: rest of the step (scoring, loss, update) {rest:.4g} s")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=MODELS, default="chain")
    parser.add_argument(
        "--steps", type=int, default=5, help="optimizer steps per run (the first is not measured)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, interleaved")
    cli = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as folder:
        model_dir = model_folder(cli.model, os.path.join(folder, "model"))
        for repeat in range(cli.repeats):
            order = list(MODES)[repeat % len(MODES) :] + list(MODES)[: repeat % len(MODES)]  # rotated
            for mode in order:
                rows = run(mode, model_dir, cli.model, cli.steps, os.path.join(folder, f"{mode}-{repeat}"))
                results[mode].extend(rows)
                print(
                    f"repeat {repeat} {mode}: "
                    + ", ".join(f"{k}={median(rows, k):.4g}" for k in EngineMeter.KEYS)
                )
    report(results)


if __name__ == "__main__":
    main()
