"""Zero-signal filtering benchmark: plain TRL vs grpo_hub in one process, same model, data and seeds.

Half of the groups of every generation batch get a constant reward, so they carry no signal. Three trainers
run interleaved repetitions of a few optimizer steps each:
  trl      - trl.GRPOTrainer
  hub-off  - GRPOHubTrainer with every extra feature off (overhead of the plugin)
  hub-filt - GRPOHubTrainer with filter_zero_signal=True
Measured (`benchmarks.common.StepTimer`, process CPU time): the training part of each step (forward +
backward + optimizer, i.e. the step minus the generation/scoring inside `_prepare_inputs`), and the whole
step. learning_rate=0 keeps the three models identical, so every trainer generates the same completions.
`benchmarks/step_time.py` sweeps the zero-signal fraction with the same harness. Run:

    python -m benchmarks.filtering [--reps 7] [--steps 4]
"""

import argparse
import tempfile

import torch

from benchmarks.common import (
    GROUP_SIZE,
    HUB_FILTER,
    HUB_OFF,
    MEDIUM_SHAPE,
    TRL,
    Spread,
    build_trainer,
    group_position_reward,
    grpo_args,
    interleaved_times,
    load_tokenizer,
    random_model,
    ratio_spread,
    zero_signal_dataset,
)

BATCH, GRAD_ACCUM = 16, 2
KINDS = (TRL, HUB_OFF, HUB_FILTER)


def summary(spread: Spread) -> str:
    return f"median {spread.median:.3f}  min {spread.low:.3f}  max {spread.high:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per repetition")
    cli = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = load_tokenizer()
    dataset = zero_signal_dataset(0.5, GRAD_ACCUM * BATCH // GROUP_SIZE, batches=cli.steps)
    with tempfile.TemporaryDirectory() as out_dir:
        trainers = {}
        for kind in KINDS:
            args = grpo_args(
                kind,
                out_dir,
                per_device_train_batch_size=BATCH,
                gradient_accumulation_steps=GRAD_ACCUM,
                max_completion_length=64,
                learning_rate=0.0,
                max_steps=cli.steps,
            )
            trainers[kind] = build_trainer(
                kind,
                args,
                model=random_model(tokenizer, MEDIUM_SHAPE),
                reward_funcs=[group_position_reward],
                train_dataset=dataset,
                processing_class=tokenizer,
            )
        times = interleaved_times(trainers, cli.reps)
    train = {kind: [t for t, _ in times[kind]] for kind in KINDS}
    whole = {kind: [t for _, t in times[kind]] for kind in KINDS}
    print(f"{cli.reps} repetitions x {cli.steps} optimizer steps, {MEDIUM_SHAPE['hidden_size']}-wide model")
    for kind, name in zip(KINDS, ("trl", "hub-off", "hub-filt"), strict=True):
        print(f"{name:9s} train s/rep: {summary(Spread.of(train[kind]))}")
    filt_train, off_train = (ratio_spread(train[k], train[TRL]) for k in (HUB_FILTER, HUB_OFF))
    filt_whole, off_whole = (ratio_spread(whole[k], whole[TRL]) for k in (HUB_FILTER, HUB_OFF))
    print(f"train-step time ratio hub-filt / trl (goal <= 0.55): {summary(filt_train)}")
    print(f"overhead ratio hub-off / trl, train part (goal <= 1.02): {summary(off_train)}")
    print(f"overhead ratio hub-off / trl, whole step incl. generation: {summary(off_whole)}")
    print(f"whole-step ratio hub-filt / trl incl. generation: {summary(filt_whole)}")


if __name__ == "__main__":
    main()
