"""Zero-signal filtering benchmark: plain TRL vs grpo_hub in one process, same model, data and seeds.

A share f of the groups of every generation batch (`--zero-fraction`, default 0.5) get a constant reward, so they
carry no signal. Four trainers
run interleaved repetitions of a few optimizer steps each:
  trl             - trl.GRPOTrainer
  hub-off         - GRPOHubTrainer with every extra feature off (overhead of the plugin)
  hub-filter      - GRPOHubTrainer with filter_zero_signal=True (kept rows packed into fewer micro-steps)
  hub-filter-thin - the same with zero_signal_pack=False (every micro-step runs, with fewer rows)
Measured (`benchmarks.common.StepTimer`): the training part of each step (forward + backward + optimizer, i.e.
the step minus the generation and scoring inside `_prepare_inputs`) and the whole step; on CPU in process CPU
time, on CUDA in wall time with `torch.cuda.synchronize`, plus the peak `torch.cuda.max_memory_allocated`.
Next to the times: training micro-steps (forwards with grad) and rows trained per repetition, so a CPU run
shows the work a GPU run saves (a GPU micro-step is latency-bound: fewer micro-steps is what saves time there).
learning_rate=0 keeps the models identical, so every trainer generates the same completions.

    python -m benchmarks.step_cost.filtering [--reps 7] [--steps 4]                 # CPU, 256-wide model
    python -m benchmarks.step_cost.filtering --device cuda [--zero-fraction 0.75]   # bf16, Qwen2.5-0.5B shape
    python -m benchmarks.step_cost.filtering --device cpu --model qwen2.5-0.5b --reps 1 --steps 1   # slow
"""

import argparse
import tempfile

import torch

from benchmarks.common import (
    DEVICES,
    GROUP_SIZE,
    HUB_FILTER,
    HUB_FILTER_THIN,
    HUB_OFF,
    MEDIUM_SHAPE,
    QWEN25_05B_CONFIG,
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
    use_device,
    zero_signal_dataset,
)

KINDS = (TRL, HUB_OFF, HUB_FILTER, HUB_FILTER_THIN)
MODELS = ("medium", "qwen2.5-0.5b")
# Per device: model, rows per micro-step, micro-steps per optimizer step, completion tokens (the GPU run:
# 64 rows = 16 groups of 4 per generation batch, 16 x 4 micro-steps, 256 tokens).
DEFAULTS = {
    "cpu": {"model": "medium", "batch": 16, "grad_accum": 2, "completion_length": 64},
    "cuda": {"model": "qwen2.5-0.5b", "batch": 16, "grad_accum": 4, "completion_length": 256},
}


def build_model(name: str, device: str):
    """(model, tokenizer): the 256-wide model with the tiny 512-token vocabulary, or the Qwen2.5-0.5B shape
    with Qwen's real 151,936-row vocabulary (`benchmarks.qwen_vocab`). Random weights; bf16 on CUDA."""
    if name == "medium":
        tokenizer = load_tokenizer()
        model = random_model(tokenizer, MEDIUM_SHAPE)
    else:
        from benchmarks.qwen_vocab import load_qwen_tokenizer

        tokenizer = load_qwen_tokenizer()
        model = random_model(tokenizer, QWEN25_05B_CONFIG)
    return (model.to(torch.bfloat16) if device == "cuda" else model), tokenizer


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per repetition")
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--model", choices=MODELS, help="default: medium on cpu, qwen2.5-0.5b on cuda")
    parser.add_argument("--batch", type=int, help="per_device_train_batch_size")
    parser.add_argument("--grad-accum", type=int, help="micro-steps per optimizer step")
    parser.add_argument("--completion-length", type=int, help="max_completion_length")
    parser.add_argument(
        "--zero-fraction", type=float, default=0.5, help="share f of zero-signal groups per generation batch"
    )
    cli = parser.parse_args(argv)
    for key, value in DEFAULTS[cli.device].items():
        if getattr(cli, key) is None:
            setattr(cli, key, value)
    return cli


def main(argv=None) -> None:
    cli = parse_args(argv)
    use_device(cli.device)
    dataset = zero_signal_dataset(
        cli.zero_fraction, cli.grad_accum * cli.batch // GROUP_SIZE, batches=cli.steps
    )
    work, peaks = {}, {}
    with tempfile.TemporaryDirectory() as out_dir:
        trainers = {}
        for kind in KINDS:
            model, tokenizer = build_model(cli.model, cli.device)
            args = grpo_args(
                kind,
                out_dir,
                cli.device,
                per_device_train_batch_size=cli.batch,
                gradient_accumulation_steps=cli.grad_accum,
                max_completion_length=cli.completion_length,
                learning_rate=0.0,
                max_steps=cli.steps,
            )
            trainers[kind] = build_trainer(
                kind,
                args,
                model=model,
                reward_funcs=[group_position_reward],
                train_dataset=dataset,
                processing_class=tokenizer,
            )
        times = interleaved_times(trainers, cli.reps, cli.device, work, peaks)
    clock = "process CPU s" if cli.device == "cpu" else "wall s (cuda synchronized)"
    print(
        f"{cli.device}, {cli.model}, {cli.reps} repetitions x {cli.steps} optimizer steps, {cli.batch} rows x "
        f"{cli.grad_accum} micro-steps per optimizer step, {cli.completion_length} completion tokens, "
        f"zero-signal share f = {cli.zero_fraction}; times in {clock} per repetition"
    )
    train = {kind: [t for t, _ in times[kind]] for kind in KINDS}
    whole = {kind: [t for _, t in times[kind]] for kind in KINDS}
    header = ["trainer", "train s (median)", "whole step s (median)", "micro-steps run", "rows trained"]
    rows = []
    for kind in KINDS:
        micro_steps, rows_trained = work[kind]
        rows.append(
            [
                kind,
                f"{Spread.of(train[kind]).median:.3f}",
                f"{Spread.of(whole[kind]).median:.3f}",
                str(micro_steps),
                str(rows_trained),
            ]
        )
    if cli.device == "cuda":
        header.append("peak MiB")
        for row, kind in zip(rows, KINDS, strict=True):
            row.append(f"{peaks[kind] / 2**20:.0f}")
    print_table(header, rows)
    print()
    goals = {
        (HUB_FILTER, "train"): "<= 0.55 (cpu), <= 0.60 (cuda), at f = 0.5",
        (HUB_OFF, "train"): "<= 1.02",
        (HUB_FILTER, "whole"): "<= 0.95 (cuda), at f = 0.5",
    }
    ratio_rows = []
    for part, measured in (("train", train), ("whole", whole)):
        for kind in (HUB_FILTER, HUB_FILTER_THIN, HUB_OFF):
            spread = ratio_spread(measured[kind], measured[TRL])
            ratio_rows.append([f"{part}: {kind} / trl", *spread_cells(spread), goals.get((kind, part), "")])
    print_table(["ratio", "median", "min", "max", "goal"], ratio_rows)


if __name__ == "__main__":
    main()
