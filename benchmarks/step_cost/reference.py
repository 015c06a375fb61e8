"""Reference-adapter benchmark: memory held for the KL reference, and refresh time per train step.

Bytes (numel * element size of the parameters, no weights needed: the models are built on the meta device):
  full-ref   - a full copy of the model, what TRL holds as `ref_model` for full fine-tuning / sync_ref_model
  trained    - the trained LoRA adapter
  ref        - grpo_hub's frozen "ref" adapter (refreshable; TRL's alternative for PEFT is the base model with
               adapters disabled, 0 bytes but never refreshed)
for the tiny test model and a Qwen2.5-0.5B-shaped config (bf16), LoRA r=16 on every linear layer.

Time: a hard refresh (`refresh_reference_adapter`, mean of repeated calls) divided by
  tiny - the mean wall time of a real GRPOHubTrainer step (generation + loss + backward + optimizer)
  0.5b - one forward + backward of a 4 x 64-token micro-batch with LoRA (random weights, fp32): a lower
         bound of a GRPO step, which also generates and scores; so the printed fraction is an upper bound.
Run:

    OMP_NUM_THREADS=1 python -m benchmarks.step_cost.reference [--skip-05b]
"""

import argparse
import statistics
import tempfile
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, TrainerCallback

from benchmarks.common import QWEN25_05B_CONFIG
from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.tasks import SMOKE_TASK, build_tiny_model, get_reward_funcs, load_task_dataset
from grpo_hub.training.reference import (
    REF_ADAPTER,
    add_reference_adapter,
    paired_parameters,
    refresh_reference_adapter,
)

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora() -> LoraConfig:
    return LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS)


def tensor_bytes(tensors) -> int:
    """Sum of numel * element size."""
    return sum(t.numel() * t.element_size() for t in tensors)


def held_bytes(config, dtype: torch.dtype) -> dict[str, int]:
    """Bytes of a full reference copy, the trained adapter and the "ref" adapter, built on the meta device."""
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(config, dtype=dtype)
        full = tensor_bytes(base.parameters())
        model = get_peft_model(base, lora(), autocast_adapter_dtype=False)
        ref_config = lora()
        ref_config.inference_mode = True
        model.add_adapter(REF_ADAPTER, ref_config, autocast_adapter_dtype=False)
    pairs = paired_parameters(model, "default")
    return {
        "full-ref": full,
        "trained": tensor_bytes(t for _, t, _ in pairs),
        "ref": tensor_bytes(r for _, _, r in pairs),
    }


def refresh_seconds(model, repeats: int) -> float:
    """Mean wall time of a hard refresh of `model`'s "ref" adapter."""
    refresh_reference_adapter(model)  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        refresh_reference_adapter(model)
    return (time.perf_counter() - start) / repeats


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (on_step_begin -> on_step_end)."""

    def __init__(self):
        self.started, self.seconds = 0.0, []

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self.started)


def tiny_step_and_refresh(steps: int, repeats: int) -> tuple[float, float]:
    """(median GRPOHubTrainer step seconds, mean refresh seconds) on the tiny model with LoRA r=16."""
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as output_dir:
        config = GRPOHubConfig(
            output_dir=output_dir,
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=32,
            beta=0.04,
            max_steps=steps,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            ref_adapter_keep=True,
        )
        trainer = GRPOHubTrainer(
            model=build_tiny_model(),
            reward_funcs=get_reward_funcs(SMOKE_TASK),
            args=config,
            train_dataset=load_task_dataset(SMOKE_TASK, n=8 * steps, seed=0),
            peft_config=lora(),
            callbacks=[timer],
        )
        trainer.train()
        return statistics.median(timer.seconds[1:]), refresh_seconds(trainer.model, repeats)


def mid_step_and_refresh(config, repeats: int) -> tuple[float, float]:
    """(forward+backward seconds of a 4x64-token micro-batch, mean refresh seconds) for `config`, fp32."""
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_config(config, dtype=torch.float32), lora())
    add_reference_adapter(model)
    tokens = torch.randint(0, config.vocab_size, (4, 64))
    model(input_ids=tokens, labels=tokens).loss.backward()  # warm-up
    start = time.perf_counter()
    model(input_ids=tokens, labels=tokens).loss.backward()
    step = time.perf_counter() - start
    return step, refresh_seconds(model, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=6, help="tiny-model GRPO steps to time")
    parser.add_argument("--repeats", type=int, default=20, help="refresh calls to average")
    parser.add_argument(
        "--skip-05b", action="store_true", help="skip the 0.5B-shaped timing (needs ~3 GB RAM)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)

    tiny_config = AutoConfig.from_pretrained(build_tiny_model())
    shapes = {
        "tiny (fp32)": (tiny_config, torch.float32),
        "qwen2.5-0.5b shape (bf16)": (Qwen2Config(**QWEN25_05B_CONFIG), torch.bfloat16),
    }
    print("| model | full ref copy | trained adapter | ref adapter | ref / trained | ref / full copy |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (config, dtype) in shapes.items():
        b = held_bytes(config, dtype)
        print(
            f"| {name} | {b['full-ref'] / 2**20:.2f} MiB | {b['trained'] / 2**20:.3f} MiB | {b['ref'] / 2**20:.3f} MiB "
            f"| {b['ref'] / b['trained']:.2f}x | {b['ref'] / b['full-ref']:.4f}x |"
        )

    print("\n| model | step (s) | refresh (ms) | refresh / step |")
    print("|---|---:|---:|---:|")
    step, refresh = tiny_step_and_refresh(args.steps, args.repeats)
    print(
        f"| tiny, GRPOHubTrainer step (8 x 32 tokens) | {step:.3f} | {refresh * 1e3:.3f} | {refresh / step:.2%} |"
    )
    if not args.skip_05b:
        step, refresh = mid_step_and_refresh(Qwen2Config(**QWEN25_05B_CONFIG), args.repeats)
        print(
            f"| qwen2.5-0.5b shape, fwd+bwd 4 x 64 tokens | {step:.3f} | {refresh * 1e3:.3f} | {refresh / step:.2%} |"
        )


if __name__ == "__main__":
    main()
