"""Server mode's two syncs against HF generate, per optimizer step, on this machine: which one to use where.

A vLLM OpenAI server (grpo_hub's `LocalServer`, fp32 unless --server-dtype; LoRA enabled for the adapter run only:
vLLM's CPU platform turns compilation off with LoRA) pinned to core 1; the trainer pinned to core 0
with one torch thread. Three runs of the same LoRA training (r = 16, every linear layer, same data and seed), one
after the other: `hf` (TRL's own HF generate, no vLLM), `merged` and `adapter` (`vllm_server_sync`), and
`merged-scoring`: `merged` with TRL's scoring forward for the IS ratio (grpo_hub takes it from the training forward
by default, docs/vllm.md). Per optimizer step (the first step of each run is left out: warm-up), medians:
  generation s   wall time of TRL's `_generate_single_turn` without the sync (HF generate, or the server's answer)
  sync s / bytes the sync's wall time and the bytes it writes for the server (merged: every base weight; adapter: A/B)
  gen + sync     per step, and its ratio to HF generate's (issue goal: <= 1.1 on the chain model)
  step s         the whole optimizer step
  rest s         step - generation - sync: scoring, rewards, forward, backward, optimizer; and its ratio to `hf`'s
Models: the shipped chain model (chain prompts, 8 prompts x 8 completions of up to 48 tokens: the main job's batch)
and a Qwen2.5-0.5B-shaped model with random weights (digits prompts, 8 completions x 32 tokens, learning rate 0).

    PYTHONPATH=. /opt/vllm-env/bin/python -m benchmarks.engines.server_sync --model chain --steps 6
    PYTHONPATH=. /opt/vllm-env/bin/python -m benchmarks.engines.server_sync --model qwen2.5-0.5b --steps 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from peft import LoraConfig
from transformers import TrainerCallback

from benchmarks.common import QUIET_CPU_RUN
from benchmarks.engines.vllm_lora_sync import model_folder
from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.generation import server_process
from grpo_hub.tasks import get_reward_funcs, load_task_dataset

MODES = ("hf", "merged", "merged-scoring", "adapter")
MODELS = {  # model -> (task, rows per step, completions per prompt, max completion tokens, learning rate)
    "chain": ("chain", 64, 8, 48, 1e-3),
    "qwen2.5-0.5b": ("digits", 8, 8, 32, 0.0),
}
TRAINER_CORE, SERVER_CORE = 0, "1"
MIB = 2**20


class StepMeter(TrainerCallback):
    """Per optimizer step: generation (without the sync), sync seconds and bytes, the whole step."""

    def __init__(self, trainer):
        self.trainer, self.rows = trainer, []
        self.sync = getattr(getattr(trainer, "vllm_generation", None), "grpo_hub_sync", None)
        generate = trainer._generate_single_turn

        def timed(*args, **kwargs):
            start = time.perf_counter()
            syncs = self.sync.syncs if self.sync else 0
            out = generate(*args, **kwargs)
            synced = self.sync is not None and self.sync.syncs > syncs
            self.current["gen_s"] += (
                time.perf_counter() - start - (self.sync.seconds_last_sync if synced else 0)
            )
            if synced:
                self.current["sync_s"] += self.sync.seconds_last_sync
                self.current["sync_bytes"] += self.sync.bytes_last_sync
            return out

        trainer._generate_single_turn = timed

    def on_step_begin(self, args, state, control, **kwargs):
        self.current = {"gen_s": 0.0, "sync_s": 0.0, "sync_bytes": 0, "start": time.perf_counter()}

    def on_step_end(self, args, state, control, **kwargs):
        self.current["step_s"] = time.perf_counter() - self.current.pop("start")
        self.current["rest_s"] = self.current["step_s"] - self.current["gen_s"] - self.current["sync_s"]
        self.rows.append(self.current)


def run(mode: str, model_dir: str, model: str, steps: int, base_url: str, out_dir: str) -> list[dict]:
    task, rows, generations, completion, learning_rate = MODELS[model]
    server = {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": base_url,
        "vllm_server_sync": mode.removesuffix("-scoring"),
    }
    args = GRPOHubConfig(
        output_dir=out_dir, **QUIET_CPU_RUN, per_device_train_batch_size=rows, num_generations=generations,
        max_completion_length=completion, learning_rate=learning_rate, max_steps=steps, seed=0,
        **(server if mode != "hf" else {}),
    )  # fmt: skip
    trainer = GRPOHubTrainer(
        model=model_dir,
        reward_funcs=get_reward_funcs(task),
        args=args,
        train_dataset=load_task_dataset(task, n=rows // generations * steps, seed=0),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0),
    )
    if mode.endswith("-scoring"):
        trainer._use_loss_time_is(False)  # TRL's scoring forward computes the old log-probs
    meter = StepMeter(trainer)
    trainer.add_callback(meter)
    trainer.train()
    return meter.rows[1:]


def median(rows, key) -> float:
    return statistics.median(row[key] for row in rows)


def report(model: str, results: dict) -> None:
    hf = median(results["hf"], "gen_s")
    hf_rest = median(results["hf"], "rest_s")
    print(
        f"\n{model}: medians per optimizer step (trainer on core {TRAINER_CORE}, server on core {SERVER_CORE})"
    )
    print(
        "| mode | generation s | sync s | MiB / sync | gen + sync s | (gen + sync) / HF generate | step s | rest s "
        "| rest / HF's rest |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, rows in results.items():
        gen, sync = median(rows, "gen_s"), median(rows, "sync_s")
        print(
            f"| {mode} | {gen:.3f} | {sync:.4f} | {median(rows, 'sync_bytes') / MIB:.2f} | {gen + sync:.3f} | "
            f"{(gen + sync) / hf:.2f} | {median(rows, 'step_s'):.3f} | {median(rows, 'rest_s'):.3f} | "
            f"{median(rows, 'rest_s') / hf_rest:.2f} |"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=MODELS, default="chain")
    parser.add_argument(
        "--steps", type=int, default=6, help="optimizer steps per run (the first is not measured)"
    )
    parser.add_argument(
        "--server-dtype", default="float32", help="float32: the trainer's; bfloat16: vLLM's CPU default"
    )
    cli = parser.parse_args(argv)
    os.sched_setaffinity(0, {TRAINER_CORE})
    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        model_dir = model_folder(cli.model, os.path.join(folder, "model"))
        for modes, rank in (
            (("hf", "merged", "merged-scoring"), None),
            (("adapter",), 16),
        ):  # LoRA: no compile
            argv = server_process.server_command(model_dir, port=8391, dtype=cli.server_dtype, lora_rank=rank)
            env = server_process.own_server_env(cores=SERVER_CORE, gpus=None)
            log = Path(folder, f"server-{modes[-1]}.log")
            with server_process.LocalServer(argv, env, log, timeout=900, cores=SERVER_CORE) as server:
                for mode in modes:
                    out = os.path.join(folder, mode)
                    results[mode] = run(mode, model_dir, cli.model, cli.steps, server.base_url, out)
    report(cli.model, results)


if __name__ == "__main__":
    main()
