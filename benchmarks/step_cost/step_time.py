"""Train-step time vs the fraction f of zero-signal groups: plain TRL vs grpo_hub, one process, same seeds.

For each f in {0, 0.25, 0.5, 0.75} exactly that fraction of the groups of every generation batch gets a
constant reward (`common.zero_signal_dataset`). Three trainers per f run interleaved repetitions:
  trl         - trl.GRPOTrainer
  hub-off     - GRPOHubTrainer with every extra feature off (the plugin's overhead)
  hub-filter  - GRPOHubTrainer with filter_zero_signal=True
learning_rate=0 keeps every model identical, so all trainers generate the same completions. Printed: the
paired ratios to TRL (median, min, max over repetitions) of the training part of a step (generation
excluded) and of the whole step (generation included), in process CPU time; `common.StepTimer` says how.
Goal for filtering: training ratio <= (1 - f) + 0.05; the physical floor is 1 - f. Goal for hub-off:
<= 1.02 (pooled over all f). Run:

    nice python -m benchmarks.step_cost.step_time [--reps 6] [--steps 1] [--quick]
"""

import argparse
import tempfile

import torch

from benchmarks.common import (
    GROUP_SIZE,
    HUB_FILTER,
    HUB_OFF,
    MEDIUM_SHAPE,
    TINY_SHAPE,
    TRL,
    Spread,
    build_trainer,
    group_position_reward,
    grpo_args,
    interleaved_times,
    load_tokenizer,
    print_table,
    random_model,
    ratio_spread,
    spread_cells,
    zero_signal_dataset,
)

ZERO_FRACTIONS = (0.0, 0.25, 0.5, 0.75)
KINDS = (TRL, HUB_OFF, HUB_FILTER)
FULL = {"shape": MEDIUM_SHAPE, "batch": 16, "completion": 64, "reps": 6, "steps": 1}
QUICK = {"shape": TINY_SHAPE, "batch": 8, "completion": 8, "reps": 2, "steps": 1}
GRAD_ACCUM = 2  # = steps_per_generation: one generation batch of 2 * batch rows per optimizer step


def build_trainers(setting: dict, output_dir: str) -> dict:
    """{(f, kind): trainer} for every zero fraction and trainer kind, all on the same random weights."""
    tokenizer = load_tokenizer()
    groups = GRAD_ACCUM * setting["batch"] // GROUP_SIZE
    trainers = {}
    for f in ZERO_FRACTIONS:
        dataset = zero_signal_dataset(f, groups, batches=setting["steps"])
        for kind in KINDS:
            args = grpo_args(
                kind,
                output_dir,
                per_device_train_batch_size=setting["batch"],
                gradient_accumulation_steps=GRAD_ACCUM,
                max_completion_length=setting["completion"],
                learning_rate=0.0,
                max_steps=setting["steps"],
            )
            trainers[f, kind] = build_trainer(
                kind,
                args,
                model=random_model(tokenizer, setting["shape"]),
                reward_funcs=[group_position_reward],
                train_dataset=dataset,
                processing_class=tokenizer,
            )
    return trainers


def report(times: dict, setting: dict) -> None:
    """Print the ratio table: one row per (f, hub kind), then the pooled hub-off overhead."""
    rows, pooled_train, pooled_total = [], [], []
    for f in ZERO_FRACTIONS:
        trl_train = [t for t, _ in times[f, TRL]]
        trl_total = [t for _, t in times[f, TRL]]
        for kind in (HUB_OFF, HUB_FILTER):
            train = [t for t, _ in times[f, kind]]
            total = [t for _, t in times[f, kind]]
            goal = f"<= {1 - f + 0.05:.2f}" if kind == HUB_FILTER else "<= 1.02"
            rows.append(
                [f"{f:.2f}", kind, goal, *spread_cells(ratio_spread(train, trl_train))]
                + spread_cells(ratio_spread(total, trl_total))[:1]
                + [f"{sum(ts) / len(ts) / setting['steps']:.2f}" for ts in (trl_train, trl_total)]
            )
            if kind == HUB_OFF:
                pooled_train += [t / b for t, b in zip(train, trl_train, strict=True)]
                pooled_total += [t / b for t, b in zip(total, trl_total, strict=True)]
    print_table(
        [
            "f",
            "trainer",
            "goal (train)",
            "train ratio median",
            "min",
            "max",
            "whole-step ratio median",
            "TRL train CPU s/step",
            "TRL whole CPU s/step",
        ],
        rows,
    )
    print()
    print_table(
        ["hub-off / trl, pooled over f", "median", "min", "max"],
        [
            ["train (generation excluded)", *spread_cells(Spread.of(pooled_train))],
            ["whole step (generation included)", *spread_cells(Spread.of(pooled_total))],
        ],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 step, 2 repetitions")
    parser.add_argument("--reps", type=int, help="repetitions per trainer")
    parser.add_argument("--steps", type=int, help="optimizer steps per repetition")
    cli = parser.parse_args(argv)
    setting = dict(QUICK if cli.quick else FULL)
    setting.update({k: v for k, v in (("reps", cli.reps), ("steps", cli.steps)) if v is not None})
    torch.set_num_threads(1)
    shape = setting["shape"]
    print(
        f"## Step time vs zero-signal fraction: hidden {shape['hidden_size']}, {shape['num_hidden_layers']} "
        f"layers, {GRAD_ACCUM} x {setting['batch']} rows x {setting['completion']} completion tokens per step, "
        f"{setting['reps']} reps x {setting['steps']} steps"
    )
    with tempfile.TemporaryDirectory() as output_dir:
        trainers = build_trainers(setting, output_dir)
        times = interleaved_times(trainers, setting["reps"])
    report(times, setting)


if __name__ == "__main__":
    main()
