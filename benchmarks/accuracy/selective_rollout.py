"""Selective rollout (GRESO) benchmark: held-out accuracy vs generated rows and time, same prompt budget.

Four configurations side by side, same seeds, same prompts, same number of epochs (the prompt budget):
  trl       - plain trl.GRPOTrainer
  filter    - GRPOHubTrainer, filter_zero_signal=True
  dynamic   - GRPOHubTrainer, dynamic_sampling=True (DAPO refill)
  greso     - GRPOHubTrainer, dynamic_sampling=True + selective_rollout=True (skip predicted zero-signal prompts)
Runs are interleaved (seed-major, configuration order rotated per seed). Per run: generated rows (completions
scored by the reward function), wall and process CPU time of `train()` (the evaluations excluded), and the
held-out accuracy at the start and after every epoch. Tasks (`--task`): see benchmarks/accuracy/rollout_tasks.py.

    python -m benchmarks.accuracy.selective_rollout --task arithmetic [--seeds 3] \\
        [--plot docs/selective-rollout.png]
    python -m benchmarks.accuracy.selective_rollout --quick   # smoke run (1 seed, tiny budget; numbers are noise)
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from benchmarks.accuracy.rollout_tasks import TASKS, Task
from benchmarks.common import QUIET_CPU_RUN
from grpo_hub import GRPOHubConfig, GRPOHubTrainer

CONFIGS = {
    "trl": None,
    "filter": {"filter_zero_signal": True},
    "dynamic": {"dynamic_sampling": True},
    "greso": {"dynamic_sampling": True, "selective_rollout": True},
}
# Selective-rollout metrics reported per run (mean over the logged optimizer steps).
SELECTIVE_METRICS = (
    "selective_rollout/skipped_all_max",
    "selective_rollout/skipped_all_min",
    "selective_rollout/explore_all_max",
    "selective_rollout/explore_all_min",
    "selective_rollout/revisit_informative_frac",
)


class Meter(TrainerCallback):
    """Counts generated rows; evaluates held-out accuracy at the start and after every epoch, off the clock.

    `points`: (generated rows, wall s, CPU s, held-out accuracy, optimizer steps) at each evaluation.
    """

    def __init__(self, task: Task, seed: int):
        self.task, self.seed, self.rows, self.points = task, seed, 0, []
        self.wall = self.cpu = 0.0

    def reward(self, prompts, completions, **kwargs):
        self.rows += len(completions)
        return self.task.reward(prompts, completions, **kwargs)

    def _clock(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu

    def _evaluate(self, model, tokenizer, step: int) -> None:
        wall, cpu = self._clock()
        rng = torch.get_rng_state()  # the evaluation must not change the training's random stream
        accuracy = self.task.accuracy(model, tokenizer, self.seed)
        torch.set_rng_state(rng)
        model.train()
        self.points.append((self.rows, wall, cpu, accuracy, step))
        done_wall, done_cpu = self._clock()
        self.wall += done_wall - wall  # stop the clock for the evaluation
        self.cpu += done_cpu - cpu

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        self._evaluate(model, processing_class, 0)

    def on_epoch_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        self._evaluate(model, processing_class, state.global_step)


def run(model_dir: str, task: Task, name: str, seed: int, epochs: int) -> dict:
    meter = Meter(task, seed)
    common = {
        "output_dir": tempfile.mkdtemp(),
        **QUIET_CPU_RUN,
        "num_train_epochs": epochs,
        "seed": seed,
        **task.args,
    }
    extra = CONFIGS[name]
    args = GRPOConfig(**common) if extra is None else GRPOHubConfig(**common, **extra)
    trainer_cls = GRPOTrainer if extra is None else GRPOHubTrainer
    torch.manual_seed(seed)
    trainer = trainer_cls(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[meter.reward],
        args=args,
        train_dataset=task.train,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=[meter],
        peft_config=task.peft,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    rows, wall, cpu, accuracy, steps = meter.points[-1]
    selective = {}
    if extra and extra.get("selective_rollout"):
        selective = {
            key: statistics.fmean(values)
            for key in SELECTIVE_METRICS
            if (values := [log[key] for log in trainer.state.log_history if key in log])
        }
    return {
        "points": meter.points,
        "steps": steps,
        "rows": rows,
        "wall": wall,
        "cpu": cpu,
        "accuracy": accuracy,
        "selective": selective,
    }


def mean_curve(runs: list[dict], index: int) -> list[float]:
    """Per evaluation (start, then each epoch): the mean over seeds of points[index]."""
    return [statistics.fmean(r["points"][i][index] for r in runs) for i in range(len(runs[0]["points"]))]


def plot(results: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, runs in results.items():
        accuracy = mean_curve(runs, 3)
        axes[0].plot(mean_curve(runs, 0), accuracy, marker=".", label=name)
        axes[1].plot(mean_curve(runs, 1), accuracy, marker=".", label=name)
    axes[0].set_xlabel("generated rows")
    axes[1].set_xlabel("wall seconds of train() (evaluations excluded)")
    for ax in axes:
        ax.set_ylabel("held-out accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def print_tables(results: dict, header: str) -> None:
    names = list(results)
    keys = ("steps", "rows", "wall", "cpu", "accuracy")
    print(header)
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
    for name in names:
        for seed, run_result in enumerate(results[name]):
            if run_result["selective"]:
                stats = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in run_result["selective"].items())
                print(f"{name} seed {seed}, mean per optimizer step: {stats}")
    epochs = len(results[names[0]][0]["points"])
    print("\nHeld-out accuracy over training (mean over seeds; generated rows so far in brackets):")
    print("| config | start | " + " | ".join(f"epoch {e}" for e in range(1, epochs)) + " |")
    print("|---" * (epochs + 1) + "|")
    for name in names:
        accuracy, rows = mean_curve(results[name], 3), mean_curve(results[name], 0)
        cells = [f"{a:.3f} ({r:.0f})" for a, r in zip(accuracy, rows, strict=True)]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=list(TASKS), default="synthetic")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=None, help="default: the task's")
    parser.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="training prompts (the budget is prompts x epochs); default: the task's",
    )
    parser.add_argument("--plot", default=None, help="write the PNG plot here")
    parser.add_argument("--quick", action="store_true", help="1 seed, 16 prompts, 2 epochs")
    cli = parser.parse_args()
    if cli.quick:
        cli.seeds, cli.prompts, cli.epochs = 1, 16, 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    task = TASKS[cli.task](cli.prompts)
    epochs = cli.epochs or task.epochs
    model_dir = task.build_model()
    names = list(CONFIGS)
    results = {name: [] for name in names}
    for seed in range(cli.seeds):
        order = names[seed % len(names) :] + names[: seed % len(names)]
        for name in order:
            results[name].append(run(model_dir, task, name, seed, epochs))
            last = results[name][-1]
            print(
                f"# seed {seed} {name}: {last['rows']} rows, {last['wall']:.1f} s wall, {last['cpu']:.1f} s CPU, "
                f"accuracy {last['accuracy']:.3f}",
                flush=True,
            )
    budget = f"task {cli.task}, {task.prompts} prompts x {epochs} epochs, {cli.seeds} seed(s)"
    print_tables(results, f"{budget}; " + "; ".join(task.notes) + "; medians over seeds; ratios to dynamic")
    if cli.plot:
        plot(
            results, cli.plot, f"selective rollout benchmark: {budget}, mean over seeds, one point per epoch"
        )
        print(f"plot: {cli.plot}")


if __name__ == "__main__":
    main()
