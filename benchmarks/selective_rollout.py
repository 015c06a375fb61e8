"""Selective rollout (GRESO) benchmark: reward and held-out accuracy vs generated rows and time, same prompt budget.

Four configurations side by side, same seeds, same prompts, same number of epochs (the prompt budget):
  trl       - plain trl.GRPOTrainer
  filter    - GRPOHubTrainer, filter_zero_signal=True
  dynamic   - GRPOHubTrainer, dynamic_sampling=True (DAPO refill)
  greso     - GRPOHubTrainer, dynamic_sampling=True + selective_rollout=True (skip predicted zero-signal prompts)
Runs are interleaved (seed-major, configuration order rotated per seed). Per run: generated rows (completions
scored by the reward function), wall and process CPU time of `train()`, the mean reward of the graded prompts per
step, and a held-out accuracy after training (mean reward of sampled completions on held-out graded prompts).

The task is a parameter (`--task`); today only `synthetic` exists: the built-in digits task on the offline tiny
model where, of every 4 prompts, 2 are graded (digit fraction, learnable), 1 always gets reward 1 (an all-max
group) and 1 always gets 0 (an all-min group). The reasoning task of the roadmap plugs in as another `Task`.

    python benchmarks/selective_rollout.py [--seeds 3] [--epochs 4] [--plot docs/selective-rollout.png]
    python benchmarks/selective_rollout.py --quick      # smoke run (1 seed, tiny budget; numbers are noise)
"""

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.tasks import RECOMMENDED_TINY_CONFIG as TINY
from grpo_hub.tasks import build_tiny_model, digit_fraction_reward, load_task_dataset

CONFIGS = {
    "trl": None,
    "filter": {"filter_zero_signal": True},
    "dynamic": {"dynamic_sampling": True},
    "greso": {"dynamic_sampling": True, "selective_rollout": True},
}
LEARNING_RATE = 1e-2
HELD_OUT_SAMPLES = 4


@dataclass
class Task:
    """Training prompts, held-out prompts, the reward function, and which prompts are graded (learnable)."""

    train: Dataset
    held_out: Dataset
    reward: Callable
    is_graded: Callable[[str], bool]


def synthetic_task(n_train: int, n_held_out: int) -> Task:
    """Digits prompts; of every 4, two graded, one always solved (reward 1), one never solved (reward 0)."""
    prompts = load_task_dataset("digits", n=n_train + n_held_out, seed=0)["prompt"]
    kinds = ("Write only digits:", "Write only digits:", "Easy:", "Hard:")
    train = [kinds[i % 4] + p[len(kinds[0]) :] for i, p in enumerate(prompts[:n_train])]

    def reward(prompts, completions, **kwargs):
        graded = digit_fraction_reward(prompts, completions)
        return [
            1.0 if p.startswith("Easy") else 0.0 if p.startswith("Hard") else r
            for p, r in zip(prompts, graded, strict=True)
        ]

    return Task(
        train=Dataset.from_dict({"prompt": train}),
        held_out=Dataset.from_dict({"prompt": prompts[n_train:]}),
        reward=reward,
        is_graded=lambda p: p.startswith(kinds[0]),
    )


TASKS = {"synthetic": synthetic_task}


class Meter(TrainerCallback):
    """Per optimizer step: (generated rows so far, wall s, CPU s, mean reward of the graded prompts in the step)."""

    def __init__(self, task: Task):
        self.task, self.rows, self.graded, self.points = task, 0, [], []
        self.wall = self.cpu = 0.0

    def reward(self, prompts, completions, **kwargs):
        rewards = self.task.reward(prompts, completions, **kwargs)
        self.rows += len(completions)
        self.graded += [r for p, r in zip(prompts, rewards, strict=True) if self.task.is_graded(p)]
        return rewards

    def on_train_begin(self, args, state, control, **kwargs):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        mean = sum(self.graded) / len(self.graded) if self.graded else float("nan")
        self.points.append((self.rows, time.perf_counter() - self.wall, time.process_time() - self.cpu, mean))
        self.graded = []


@torch.no_grad()
def held_out_accuracy(model, tokenizer, task: Task, seed: int) -> float:
    """Mean task reward of HELD_OUT_SAMPLES sampled completions per held-out prompt."""
    torch.manual_seed(seed)
    model.eval()
    tokenizer.padding_side = "left"
    prompts = [p for p in task.held_out["prompt"] for _ in range(HELD_OUT_SAMPLES)]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=TINY["max_completion_length"], do_sample=True)
    completions = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    rewards = task.reward(prompts, completions)
    return sum(rewards) / len(rewards)


def run(model_dir: str, task: Task, name: str, seed: int, epochs: int) -> dict:
    meter = Meter(task)
    common = {
        "output_dir": tempfile.mkdtemp(),
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "log_level": "error",
        "logging_steps": 1,
        "num_train_epochs": epochs,
        "seed": seed,
        "learning_rate": LEARNING_RATE,
        "num_generations": TINY["num_generations"],
        "per_device_train_batch_size": TINY["per_device_train_batch_size"],
        "max_completion_length": TINY["max_completion_length"],
        "beta": TINY["beta"],
    }
    extra = CONFIGS[name]
    args = GRPOConfig(**common) if extra is None else GRPOHubConfig(**common, **extra)
    trainer_cls = GRPOTrainer if extra is None else GRPOHubTrainer
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = trainer_cls(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[meter.reward],
        args=args,
        train_dataset=task.train,
        processing_class=tokenizer,
        callbacks=[meter],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    wall, cpu = meter.points[-1][1], meter.points[-1][2]
    accuracy = held_out_accuracy(trainer.model, tokenizer, task, seed)
    return {
        "points": meter.points,
        "steps": len(meter.points),
        "rows": meter.rows,
        "wall": wall,
        "cpu": cpu,
        "accuracy": accuracy,
    }


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, runs in results.items():
        points = [p for p in runs[0]["points"] if p[3] == p[3]]  # the first seed; steps with graded prompts
        rewards = [statistics.fmean(p[3] for p in points[max(0, i - 2) : i + 1]) for i in range(len(points))]
        axes[0].plot([p[0] for p in points], rewards, label=name)
        axes[1].plot([p[2] for p in points], rewards, label=name)
    axes[0].set_xlabel("generated rows")
    axes[1].set_xlabel("process CPU seconds")
    for ax in axes:
        ax.set_ylabel("graded reward (3-step mean)")
        ax.legend()
    fig.suptitle("selective rollout benchmark, first seed, synthetic graded task")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=list(TASKS), default="synthetic")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument(
        "--prompts", type=int, default=48, help="training prompts (the budget is prompts x epochs)"
    )
    parser.add_argument("--plot", default=None, help="write the PNG plot here")
    parser.add_argument("--quick", action="store_true", help="1 seed, 16 prompts, 2 epochs")
    cli = parser.parse_args()
    if cli.quick:
        cli.seeds, cli.prompts, cli.epochs = 1, 16, 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    model_dir = build_tiny_model()
    task = TASKS[cli.task](cli.prompts, 16)
    names = list(CONFIGS)
    results = {name: [] for name in names}
    for seed in range(cli.seeds):
        order = names[seed % len(names) :] + names[: seed % len(names)]
        for name in order:
            results[name].append(run(model_dir, task, name, seed, cli.epochs))
    print(
        f"task {cli.task}, {cli.prompts} prompts x {cli.epochs} epochs, {cli.seeds} seed(s); medians over seeds; "
        "ratios to dynamic"
    )
    keys = ("steps", "rows", "wall", "cpu", "accuracy")
    print(
        "| config | optimizer steps | generated rows | wall s | CPU s | held-out accuracy | accuracy per seed "
        "| rows / dynamic | wall / dynamic | CPU / dynamic |"
    )
    print("|---" * 10 + "|")
    base = {key: statistics.median(r[key] for r in results["dynamic"]) for key in keys}
    for name in names:
        med = {key: statistics.median(r[key] for r in results[name]) for key in keys}
        per_seed = " / ".join(f"{r['accuracy']:.3f}" for r in results[name])
        print(
            f"| {name} | {med['steps']:.0f} | {med['rows']:.0f} | {med['wall']:.1f} | {med['cpu']:.1f} "
            f"| {med['accuracy']:.3f} | {per_seed} | {med['rows'] / base['rows']:.3f} "
            f"| {med['wall'] / base['wall']:.3f} | {med['cpu'] / base['cpu']:.3f} |"
        )
    if cli.plot:
        plot(results, cli.plot)
        print(f"plot: {cli.plot}")


if __name__ == "__main__":
    main()
