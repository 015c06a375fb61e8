"""Memory of a refreshable KL reference: TRL's full reference model vs grpo_hub's "ref" adapter.

Four trainers on the same Qwen2.5-0.5B-shaped model (random bf16 weights built from the config and saved
to a temporary folder, since TRL loads its reference model from the policy's path):
  trl-full       - trl.GRPOTrainer, full fine-tuning, beta=0: no reference (baseline of the next one)
  trl-full-sync  - trl.GRPOTrainer, full fine-tuning, beta=0.04, sync_ref_model=True: a second full model
  trl-lora       - trl.GRPOTrainer with LoRA, beta=0.04: the base with adapters off (0 bytes, never refreshed;
                   baseline of the next one)
  hub-lora-ref   - GRPOHubTrainer with LoRA, beta=0.04, ref_adapter_sync_on="steps" every step: a "ref" adapter
LoRA is r=16 on every linear layer. Printed per trainer: bytes of the reference weights (numel x element
size of the reference model's parameters or of the "ref" adapter's tensors), peak RSS (VmHWM) after the
imports and after two training steps (each refreshing the reference), and that peak minus its baseline's:
what holding (and refreshing) the reference costs. Peak RSS is per process, so each trainer runs in a fresh
child process. Peaks are taken after training because the weights are memory-mapped and only become
resident when used; the full fine-tuning peaks also hold gradients and AdamW state for every weight. Run:

    nice python -m benchmarks.step_cost.memory [--quick]
"""

import argparse
import json
import subprocess
import sys
import tempfile

import torch

from benchmarks.common import QWEN25_05B_CONFIG, TINY_SHAPE, load_tokenizer, print_table

BASELINES = {"trl-full-sync": "trl-full", "hub-lora-ref": "trl-lora"}  # same fine-tuning, no refreshable ref
VARIANTS = ("trl-full", "trl-full-sync", "trl-lora", "hub-lora-ref")
BETA = 0.04
STEPS = 2


def save_random_model(folder: str, quick: bool) -> None:
    """Random-weight bf16 Qwen2 (0.5B-shaped, or tiny with --quick) plus the offline tokenizer, in `folder`.

    Generated ids beyond the 512-token tokenizer decode to "", which only the (constant) reward sees.
    """
    from transformers import AutoModelForCausalLM, Qwen2Config

    tokenizer = load_tokenizer()
    shape = (
        {**TINY_SHAPE, "vocab_size": len(tokenizer), "tie_word_embeddings": True}
        if quick
        else QWEN25_05B_CONFIG
    )
    config = Qwen2Config(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **shape)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far: Linux's VmHWM, in MiB.

    Not `ru_maxrss`: that also counts the parent's resident size at fork time, which the child inherits.
    """
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def constant_reward(prompts, completions, **kwargs) -> list[float]:
    return [0.0] * len(prompts)


def measure(variant: str, model_dir: str) -> dict:
    """Build `variant`'s trainer on `model_dir`, train STEPS steps; reference bytes and peak RSS (MiB)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from grpo_hub import GRPOHubConfig, GRPOHubTrainer
    from grpo_hub.training.reference import paired_parameters, trained_adapter_name

    after_imports = peak_rss_mib()
    settings = {
        "use_cpu": True,
        "bf16": False,
        "model_init_kwargs": {"dtype": "bfloat16"},
        "beta": 0.0 if variant == "trl-full" else BETA,
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_completion_length": 8,
        "max_steps": STEPS,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "log_level": "error",
    }
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
    with tempfile.TemporaryDirectory() as output_dir:
        if variant.startswith("trl-full"):
            sync = variant == "trl-full-sync"
            trainer_cls, args, peft = (
                GRPOTrainer,
                GRPOConfig(output_dir, sync_ref_model=sync, **settings),
                None,
            )
        elif variant == "trl-lora":
            trainer_cls, args, peft = GRPOTrainer, GRPOConfig(output_dir, **settings), lora
        else:
            args = GRPOHubConfig(
                output_dir, ref_adapter_sync_on="steps", ref_adapter_sync_steps=1, **settings
            )
            trainer_cls, peft = GRPOHubTrainer, lora
        trainer = trainer_cls(
            model=model_dir,
            reward_funcs=[constant_reward],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["Write only digits: 1"] * 8}),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            peft_config=peft,
        )
        if variant == "trl-full-sync":
            ref_tensors = list(trainer.ref_model.parameters())
        elif variant == "hub-lora-ref":
            model = trainer.model
            ref_tensors = [ref for _, _, ref in paired_parameters(model, trained_adapter_name(model))]
        else:
            ref_tensors = []
        ref_bytes = sum(t.numel() * t.element_size() for t in ref_tensors)
        del ref_tensors
        trainer.train()
    return {
        "ref_bytes": ref_bytes,
        "rss_imports": after_imports,
        "rss_trained": peak_rss_mib(),
    }


def run_child(variant: str, model_dir: str) -> dict:
    """`measure(variant)` in a fresh Python process (its own peak RSS)."""
    command = [sys.executable, "-m", "benchmarks.step_cost.memory", "--child", variant, model_dir]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model instead of the 0.5B shape")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "MODEL_DIR"), help=argparse.SUPPRESS)
    cli = parser.parse_args(argv)
    torch.set_num_threads(1)
    if cli.child:
        print(json.dumps(measure(*cli.child)))
        return
    shape = "tiny" if cli.quick else "Qwen2.5-0.5B-shaped"
    print(f"## Reference memory: {shape} model, random bf16 weights, LoRA r=16 all-linear, {STEPS} steps")
    with tempfile.TemporaryDirectory() as model_dir:
        save_random_model(model_dir, cli.quick)
        results = {variant: run_child(variant, model_dir) for variant in VARIANTS}
    full = results["trl-full-sync"]["ref_bytes"]
    rows = []
    for variant, r in results.items():
        baseline = BASELINES.get(variant)
        extra = f"{r['rss_trained'] - results[baseline]['rss_trained']:+.0f}" if baseline else "-"
        rows.append(
            [
                variant,
                f"{r['ref_bytes'] / 2**20:.1f}",
                f"{r['ref_bytes'] / full:.4f}",
                f"{r['rss_imports']:.0f}",
                f"{r['rss_trained']:.0f}",
                extra,
            ]
        )
    print_table(
        [
            "trainer",
            "reference MiB",
            "vs full copy",
            "peak RSS MiB after imports",
            f"after {STEPS} steps",
            "minus baseline",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
