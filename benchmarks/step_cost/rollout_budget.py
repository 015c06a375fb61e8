"""Per-prompt rollout budgets (`rollout_budget`) beside uniform ones (TRL's `num_generations` per prompt): the main
job's step at the same completions per step, generation and train part apart, side by side in one run.

The LoRA main job (`recipes/configs/chain.yaml`: chain model, 8 problems x 8 completions of up to 48 tokens) as
`GRPOHubTrainer`, uniform and `rollout_budget="knapsack"` with the level as prior, learning rate 0, torch reseeded
before each generation. Each `train()` is one step on the same first batch of the data, so the budgets' history grows
with every repetition: after `--warm` untimed steps each prompt has been scored and the budgets are ragged (the first
step of a run is uniform: nothing is known yet). Repetitions interleaved, the order rotated.

Printed per configuration: median seconds of the whole step, its generation part (generation, rewards, scoring
forwards, the budgets' allocation) and its train part (forward, backward, optimizer step), each with the paired ratio
to uniform (median, min, max); generated rows and tokens per step, and the budgets' spread (std, min-max).

    python -m benchmarks.step_cost.rollout_budget [--reps 5] [--warm 2] [--device cpu|cuda] [--quick]
"""

import argparse
import os
import statistics

import torch
from transformers import TrainerCallback

from benchmarks.common import DEVICES, check_device, interleaved_times, print_table, ratio_spread
from benchmarks.step_cost.padding_free import RECIPE, main_job_trainer

CONFIGS = {
    "uniform (TRL)": {},
    "knapsack": {"rollout_budget": "knapsack", "rollout_budget_column": "level"},
}
HEADER = ["budgets", "step s", "ratio", "generation s", "ratio", "train s", "ratio", "rows / step",
          "tokens / step", "budget std", "budget min-max"]  # fmt: skip


class StepLogs(TrainerCallback):
    """Every step's logged metrics, across `train()` calls (each call starts a new `TrainerState`)."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "completions/mean_length" in logs:
            self.logs.append(dict(logs))


def cell(values: list[float], baseline: list[float]) -> list[str]:
    spread = ratio_spread(values, baseline)
    return [f"{statistics.median(values):.3f}", f"{spread.median:.3f} ({spread.low:.3f}-{spread.high:.3f})"]


def measure(reps: int, warm: int, device: str, recipe: str = RECIPE) -> list[list[str]]:
    trainers = {name: main_job_trainer(recipe, {**settings, "use_cpu": device == "cpu"})
                for name, settings in CONFIGS.items()}  # fmt: skip
    logs = {name: StepLogs() for name in trainers}
    for name, trainer in trainers.items():
        for _ in range(warm):  # the history each prompt's budget is drawn from
            trainer.train()
        trainer.add_callback(logs[name])
    times = interleaved_times(trainers, reps, device)
    parts = {
        name: {
            "step": [t for _, t in runs],
            "generation": [t - s for s, t in runs],
            "train": [s for s, _ in runs],
        }
        for name, runs in times.items()
    }
    baseline = parts["uniform (TRL)"]
    rows = []
    for name, part in parts.items():
        timed = logs[name].logs[-reps:]  # the timed steps (after interleaved_times' own warm-up step)
        rows_per_step = (
            trainers[name].args.per_device_train_batch_size * trainers[name].args.steps_per_generation
        )
        tokens = statistics.mean(log["completions/mean_length"] * rows_per_step for log in timed)
        spread = [log.get("rollout_budget/std", 0.0) for log in timed]
        low = min(log.get("rollout_budget/min", trainers[name].args.num_generations) for log in timed)
        high = max(log.get("rollout_budget/max", trainers[name].args.num_generations) for log in timed)
        rows.append([
            name, *cell(part["step"], baseline["step"]), *cell(part["generation"], baseline["generation"]),
            *cell(part["train"], baseline["train"]), str(rows_per_step), f"{tokens:,.0f}",
            f"{statistics.mean(spread):.2f}", f"{low:.0f}-{high:.0f}",
        ])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warm", type=int, default=2, help="untimed steps that build the history first")
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--recipe", default=RECIPE, help="the recipe YAML whose step is measured")
    parser.add_argument("--quick", action="store_true", help="1 warm step, 1 repetition")
    cli = parser.parse_args()
    if cli.quick:
        cli.reps, cli.warm = 1, 1
    if cli.device == "cuda":
        check_device("cuda")
    else:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        torch.set_num_threads(1)
    print(f"## Main job ({cli.recipe}), one step per repetition, {cli.warm} warm step(s), {cli.reps} repetitions, "
          f"{cli.device}\n")  # fmt: skip
    print_table(HEADER, measure(cli.reps, cli.warm, cli.device, cli.recipe))


if __name__ == "__main__":
    main()
