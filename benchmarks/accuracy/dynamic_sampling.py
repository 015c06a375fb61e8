"""Dynamic sampling benchmark: graded reward vs wall time, with and without DAPO dynamic sampling.

Built-in `digits` task on the offline tiny model, full fine-tuning at lr 1e-2 (slow enough that the
configurations differ; grpo_hub.tasks measures 0.18 -> 0.65 in 30 steps), batch 16 = 4 groups of 4, in two
variants: every prompt graded ("digits"), and only one prompt in 4 graded, the others getting a constant
reward, so 3 groups in 4 carry no signal ("digits, 3/4 flat"). Three GRPOHubTrainer configurations:
  plain    - no filtering (TRL's behaviour)
  filter   - filter_zero_signal=True (drops zero-signal rows before the training forward)
  dynamic  - dynamic_sampling=True (refills to 4 informative groups per step, at most 4 extra rounds)
Each run trains `--steps` optimizer steps; after every step a callback records the wall time since training
started, the mean digit reward of the graded prompts generated in that step, and the rows trained. Wall time
on the shared CPU box is noisy: compare orders of magnitude, not percent. Run:

    python -m benchmarks.accuracy.dynamic_sampling [--steps 40]
    python -m benchmarks --only dynamic_sampling   # the same, from the runner
"""

import argparse
import os
import tempfile
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from benchmarks.common import SMOKE_SETTINGS
from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.tasks import build_tiny_model, digit_fraction_reward, load_task_dataset

CONFIGS = {
    "plain": {},
    "filter": {"filter_zero_signal": True},
    "dynamic": {"dynamic_sampling": True, "dynamic_sampling_max_rounds": 4},
}
THRESHOLD = 0.5
LEARNING_RATE = 1e-2


def dataset(n: int, graded_every: int) -> Dataset:
    """The digits prompts; all but every `graded_every`-th one rewritten to "Stay quiet" (constant reward)."""
    prompts = load_task_dataset("digits", n=n, seed=0)["prompt"]
    return Dataset.from_dict(
        {"prompt": [p if i % graded_every == 0 else "Stay quiet:" + p[18:] for i, p in enumerate(prompts)]}
    )


def graded_reward(prompts, completions, log_metric=None, **kwargs):
    """Digit fraction on the digits prompts, 0.5 on "Stay quiet"; logs the graded prompts' mean."""
    rewards = digit_fraction_reward(prompts, completions)
    graded = [r for p, r in zip(prompts, rewards, strict=True) if not p.startswith("Stay")]
    if graded and log_metric is not None:
        log_metric("graded_reward", sum(graded) / len(graded))
    return [0.5 if p.startswith("Stay") else r for p, r in zip(prompts, rewards, strict=True)]


class Clock(TrainerCallback):
    """(seconds since train start, graded reward, trained rows) per logged step."""

    def __init__(self):
        self.points, self.start = [], None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "graded_reward" in logs:
            trained = logs.get("zero_signal/rows_trained", args.per_device_train_batch_size)
            self.points.append((time.perf_counter() - self.start, logs["graded_reward"], trained))


def run(model_dir: str, train_data: Dataset, steps: int, extra: dict) -> Clock:
    torch.manual_seed(0)
    clock = Clock()
    args = GRPOHubConfig(
        output_dir=tempfile.mkdtemp(),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        log_level="error",
        logging_steps=1,
        max_steps=steps,
        seed=0,
        shuffle_dataset=False,
        learning_rate=LEARNING_RATE,
        num_generations=SMOKE_SETTINGS["num_generations"],
        per_device_train_batch_size=SMOKE_SETTINGS["per_device_train_batch_size"],
        max_completion_length=SMOKE_SETTINGS["max_completion_length"],
        beta=SMOKE_SETTINGS["beta"],
        **extra,
    )
    trainer = GRPOHubTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[graded_reward],
        args=args,
        train_dataset=train_data,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=[clock],
    )
    trainer.train()
    return clock


def reached(points, threshold: float) -> tuple[str, str]:
    """(step, wall seconds) at which the mean graded reward of 3 consecutive steps first reaches `threshold`."""
    for i in range(2, len(points)):
        if sum(p[1] for p in points[i - 2 : i + 1]) / 3 >= threshold:
            return str(i + 1), f"{points[i][0]:.1f}"
    return "never", "-"


def reward_at(points, seconds: float) -> str:
    """Mean graded reward of the last 3 steps finished within `seconds` of wall time ("-": none finished)."""
    done = [p[1] for p in points if p[0] <= seconds][-3:]
    return f"{sum(done) / len(done):.2f}" if done else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    cli = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    model_dir = build_tiny_model()
    header = (
        f"| task | config | train s | rows trained/step | graded reward first 5 -> last 5 | step to {THRESHOLD} "
        f"| s to {THRESHOLD} | reward at the fastest run's end |"
    )
    print(header + "\n" + "|---" * 8 + "|")
    for task, graded_every in (("digits", 1), ("digits, 3/4 flat", 4)):
        data = dataset(cli.steps * 4 * 5 * 2, graded_every)
        runs = {name: run(model_dir, data, cli.steps, extra).points for name, extra in CONFIGS.items()}
        fastest = min(points[-1][0] for points in runs.values())
        for name, points in runs.items():
            rewards = [p[1] for p in points]
            rows = sum(p[2] for p in points) / len(points)
            first, last = (sum(part) / len(part) for part in (rewards[:5], rewards[-5:]))
            step, seconds = reached(points, THRESHOLD)
            print(
                f"| {task} | {name} | {points[-1][0]:.1f} | {rows:.1f} | {first:.2f} -> {last:.2f} | {step} "
                f"| {seconds} | {reward_at(points, fastest)} ({fastest:.1f} s) |"
            )


if __name__ == "__main__":
    main()
