"""Shared-prompt forwards (`shared_prompts`) beside padding-free's and TRL's padded ones, side by side in one run: the
trainer's forward + backward, the tokens it computes, and the activations it keeps for the backward.

prompt-heavy  one micro-batch at the Qwen2.5-0.5B layer shape (`benchmarks.step_cost.padding_free.long_tail_model`:
              hidden 896, 14 / 2 heads, MLP 4,864, LoRA r 16 on every linear layer, `--layers` layers, vocabulary
              32,768), random weights, fp32: `--prompts` prompts of `--prompt-tokens` tokens with `--group`
              completions each, of up to `--max-completion` tokens drawn from Beta(1.2, 1.8) (mean 40 % of the
              maximum: the long tail of benchmarks/step_cost/padding_free.py), in TRL's layout (rows shuffled, padded
              to the longest prompt and completion); TRL's padded forward with its fused LM head against
              `PaddingFreeForward` without and with `shared`, fwd + bwd, interleaved, one thread. `--micro-batches k`:
              the rows are one optimizer step's generation batch, split as TRL splits it into k micro-batches (fwd +
              bwd of each, gradients accumulated), and shared prompts also run on whole groups
              (`shared_prompts_whole_groups`: the micro-batches re-split by `whole_group_micro_batches`, as the
              trainer does).
main job      the LoRA main job (`recipes/configs/chain.yaml`: chain model, 8 problems x 8 completions of up to 48
              tokens, one 64-row micro-batch), `GRPOHubTrainer` padded, padding-free and with shared prompts, learning
              rate 0 (torch reseeded before each generation: the same rollouts in the three), one step per repetition,
              interleaved. Train part = the step minus generation and rewards (forward, backward, optimizer step).

`--device cuda`: the prompt-heavy shape only, at the full size (24 layers, Qwen2.5's vocabulary), bf16, synchronized
wall seconds, the allocator's peak memory and the GPU kernels' seconds over the wall seconds of one forward + backward.

Printed per configuration: median seconds and the paired ratios to the padded and the padding-free forward (median,
min, max), tokens computed per micro-step (with the padding or the bins' tails) and their ratio to the rows' real
tokens (below 1: repeated prompts not computed), and the activations autograd saves for the backward (MiB; parameters left out: a deterministic stand-in for a CPU
step's peak memory); prompt-heavy also the largest log-prob difference to the padded forward.

    python -m benchmarks.step_cost.shared_prompts [--reps 3] [--threads 1|2] [--skip-main-job] \\
        [--skip-prompt-heavy] [--quick]
    python -m benchmarks.step_cost.shared_prompts --skip-main-job --prompts 4 --group 4 --micro-batches 4 \\
        --prompt-tokens 256
    python -m benchmarks.step_cost.shared_prompts --device cuda --reps 10
"""

import argparse
import os
import statistics
import time
from contextlib import nullcontext
from functools import partial

import torch

from benchmarks.common import DEVICES, print_table, ratio_spread
from benchmarks.step_cost.padding_free import (
    MIB,
    RECIPE,
    PeakMemory,
    Work,
    forward_backward,
    gpu_busy,
    long_tail_model,
    main_job_trainer,
    metered_times,
    model_size,
    padded_forward,
)
from grpo_hub.algos.shared_prompts import whole_group_micro_batches
from grpo_hub.training.padding_free import PaddingFreeForward

CONFIGS = {
    "padded (TRL)": {"padding_free": False},
    "padding-free": {"padding_free": True},
    "shared prompts": {"padding_free": True, "shared_prompts": True},
}
WHOLE = (
    "shared prompts, whole groups"  # shared prompts on micro-batches re-split by whole_group_micro_batches
)
HEADER = ["forwards", "train s", "ratio to padded", "ratio to padding-free", "tokens / micro-step",
          "computed / real tokens", "saved MiB"]  # fmt: skip


def ratios(times: dict[str, list[float]], name: str) -> list[str]:
    cells = []
    for baseline in ("padded (TRL)", "padding-free"):
        spread = ratio_spread(times[name], times[baseline])
        cells.append(f"{spread.median:.3f} ({spread.low:.3f}-{spread.high:.3f})")
    return cells


def measure_main_job(reps: int, threads: int, recipe: str = RECIPE) -> list[list[str]]:
    trainers = {name: main_job_trainer(recipe, settings) for name, settings in CONFIGS.items()}
    times, real, work, steps = metered_times(trainers, reps, threads)
    train = {name: [t for t, _ in times[name]] for name in trainers}
    rows = []
    for name in trainers:
        meter = work[name]
        rows.append([
            name, f"{statistics.median(train[name]):.3f}", *ratios(train, name),
            f"{meter.tokens / meter.forwards:,.0f}", f"{meter.tokens / real[name][0]:.2f}",
            f"{meter.peak_saved / MIB:.1f}",
        ])  # fmt: skip
    return rows


def prompt_heavy_batch(
    prompts: int, group: int, prompt_tokens: int, max_completion: int, generator, vocab: int
):
    """TRL's layout of `prompts` x `group` rows: each prompt of `prompt_tokens` tokens, repeated over its group's rows;
    completions of Beta(1.2, 1.8) x `max_completion` tokens (at least 1); rows shuffled (TRL's micro-batch)."""
    beta = torch.distributions.Beta(torch.tensor(1.2), torch.tensor(1.8))  # torch's global generator
    completions = (beta.sample((prompts * group,)) * max_completion).long().clamp(min=1)
    width = int(completions.max())
    ids = torch.randint(1, vocab, (prompts * group, prompt_tokens + width), generator=generator)
    heads = torch.randint(1, vocab, (prompts, prompt_tokens), generator=generator)
    ids[:, :prompt_tokens] = heads.repeat_interleave(group, dim=0)
    mask = torch.zeros_like(ids)
    for r in range(len(ids)):
        mask[r, : prompt_tokens + completions[r]] = 1
    order = torch.randperm(len(ids), generator=generator)
    return ids[order], mask[order], width


def micro_batches(ids: torch.Tensor, mask: torch.Tensor, keep: int, count: int, whole_groups: bool) -> list:
    """TRL's split of a shuffled generation batch (`ids`, `mask`: `keep` completion columns) into `count`
    micro-batches, as (ids, mask, keep) each; with `whole_groups`, re-split by `whole_group_micro_batches` as the
    trainer does (one block: every micro-batch of one optimizer step)."""
    width = ids.shape[1] - keep
    split = [{"prompt_ids": i[:, :width], "prompt_mask": m[:, :width], "completion_ids": i[:, width:],
              "completion_mask": m[:, width:]} for i, m in zip(ids.chunk(count), mask.chunk(count), strict=True)]  # fmt: skip
    if whole_groups:
        split = whole_group_micro_batches(split, count)
    return [(torch.cat([b["prompt_ids"], b["completion_ids"]], 1), torch.cat([b["prompt_mask"], b["completion_mask"]], 1),
             b["completion_ids"].shape[1]) for b in split]  # fmt: skip


def measure_prompt_heavy(reps: int, prompts: int, group: int, prompt_tokens: int, max_completion: int,
                         layers: int, vocab: int = 32768, device: str = "cpu",
                         dtype: torch.dtype = torch.float32, count: int = 1) -> list[list[str]]:  # fmt: skip
    """The forwards, fwd + bwd of the `count` micro-batches of one optimizer step (their gradients accumulated),
    interleaved (the order rotated each repetition); with `count` > 1 shared prompts also on whole groups. The first
    batch warms up and gives the largest log-prob difference to the padded forward. On CUDA: synchronized wall seconds,
    and the GPU kernels' share of one more forward + backward of a micro-batch (`gpu_busy`)."""
    model = long_tail_model(layers, vocab, device, dtype)
    generator = torch.Generator().manual_seed(0)
    batches = [prompt_heavy_batch(prompts, group, prompt_tokens, max_completion, generator, vocab)
               for _ in range(reps + 1)]  # fmt: skip
    batches = [(ids.to(device), mask.to(device), keep) for ids, mask, keep in batches]

    def packed(shared: bool):
        forward = PaddingFreeForward(0, nullcontext, shared=shared)
        return lambda ids, mask, keep: forward(model, ids, mask, keep, compute_entropy=True)[:2]

    runs = {
        "padded (TRL)": partial(padded_forward, model),
        "padding-free": packed(False),
        "shared prompts": packed(True),
    }
    if count > 1:
        runs[WHOLE] = runs["shared prompts"]
    times, tokens, peak, logps = ({name: [] for name in runs}, dict.fromkeys(runs, 0), {}, {})
    work = Work(model)
    memory = PeakMemory(device, work)
    clock = time.process_time if device == "cpu" else time.perf_counter
    for rep, (ids, mask, keep) in enumerate(batches):
        names = list(runs)[rep % len(runs) :] + list(runs)[: rep % len(runs)]
        for name in names:
            model.zero_grad()
            work.tokens = 0
            parts = micro_batches(ids, mask, keep, count, whole_groups=name == WHOLE)
            with memory.measuring():
                start = clock()
                outs = [forward_backward(runs[name], *part) for part in parts]
                if device == "cuda":
                    torch.cuda.synchronize()
                elapsed = clock() - start
            if rep:
                times[name].append(elapsed)
                tokens[name] += work.tokens
                peak[name] = max(peak.get(name, 0), memory.peak())
            else:  # each row's log-probs, by its tokens (whole groups reorder the rows)
                logps[name] = row_logps(parts, outs)
    real = sum(int(mask.sum()) for _, mask, _ in batches[1:])
    part = micro_batches(*batches[-1], count, whole_groups=False)[0]
    busy = {name: gpu_busy(run, *part) if device == "cuda" else "-" for name, run in runs.items()}
    table = []
    for name in runs:
        gap = max(
            (logps[name][row] - value).abs().max().item() for row, value in logps["padded (TRL)"].items()
        )
        table.append([
            name, f"{statistics.median(times[name]):.3f}", *ratios(times, name),
            f"{tokens[name] / reps / count:,.0f}", f"{tokens[name] / real:.2f}", f"{peak[name] / MIB:,.1f}",
            f"{gap:.1e}", busy[name],
        ])  # fmt: skip
    return table


def row_logps(parts: list, outs: list[torch.Tensor]) -> dict[tuple, torch.Tensor]:
    """{a row's real tokens: its completion log-probs} over micro-batches (rows are told apart by their tokens)."""
    rows = {}
    for (ids, mask, keep), out in zip(parts, outs, strict=True):
        for r in range(ids.shape[0]):
            rows[tuple(ids[r][mask[r].bool()].tolist())] = out[r].detach().float()[mask[r, -keep:].bool()]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="cuda: the prompt-heavy shape only, bf16, full size (24 layers, Qwen2.5's vocabulary)")  # fmt: skip
    parser.add_argument("--threads", type=int, choices=(1, 2), default=1, help="main job: threads")
    parser.add_argument("--recipe", default=RECIPE, help="main job: the recipe YAML whose step is measured")
    parser.add_argument("--prompts", type=int, default=1, help="prompt-heavy: prompts in the micro-batch")
    parser.add_argument("--group", type=int, default=8, help="prompt-heavy: completions per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-completion", type=int, default=256)
    parser.add_argument("--micro-batches", type=int, default=1,
                        help="prompt-heavy: micro-batches per optimizer step (TRL's split; > 1 adds whole groups)")  # fmt: skip
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--skip-main-job", action="store_true")
    parser.add_argument("--skip-prompt-heavy", action="store_true")
    parser.add_argument(
        "--quick", action="store_true", help="1 repetition, 1 layer, prompts of 64, completions of 32"
    )
    cli = parser.parse_args()
    if cli.quick:
        cli.reps, cli.layers, cli.prompt_tokens, cli.max_completion = 1, 1, 64, 32
        cli.prompts, cli.group, cli.micro_batches = 2, 4, 2
    cuda = cli.device == "cuda"
    cli.layers, vocab, dtype = model_size(cli.device, cli.layers)
    if not cuda and cli.threads == 1:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(cli.threads)
    if not cli.skip_prompt_heavy:
        torch.set_num_threads(1)
        print(f"## Prompt-heavy: {cli.prompts} prompt(s) of {cli.prompt_tokens} tokens x {cli.group} completions of up "
              f"to {cli.max_completion} tokens (mean 40 %) in {cli.micro_batches} micro-batch(es), {cli.layers} "
              f"Qwen2.5-0.5B-shaped layers, vocabulary {vocab:,}, LoRA r 16, {dtype}, {cli.device}, {cli.reps} "
              "repetitions\n")  # fmt: skip
        header = [
            *HEADER[:-1],
            "peak MiB" if cuda else "saved MiB",
            "max log-prob gap",
            "GPU kernels s / wall s",
        ]
        print_table(header, measure_prompt_heavy(cli.reps, cli.prompts, cli.group, cli.prompt_tokens,
                                                 cli.max_completion, cli.layers, vocab, cli.device, dtype,
                                                 cli.micro_batches))  # fmt: skip
        torch.set_num_threads(cli.threads)
    if not cli.skip_main_job and not cuda:
        print(f"\n## Main job ({cli.recipe}), one step per repetition, {cli.reps} repetitions, {cli.threads} "
              f"thread(s)\n")  # fmt: skip
        print_table(HEADER, measure_main_job(cli.reps, cli.threads, cli.recipe))


if __name__ == "__main__":
    main()
