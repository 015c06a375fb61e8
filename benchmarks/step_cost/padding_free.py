"""Padding-free forwards (`padding_free`) against TRL's padded ones: the trainer's forward + backward per step, the
tokens it computes, and the activations it keeps for the backward.

main job   the LoRA main job (`recipes/configs/chain.yaml`: the shipped chain model, 8 problems x 8 completions of up
           to 48 tokens, one 64-row micro-batch), `GRPOHubTrainer` with padding_free off and on, learning rate 0 (the
           same rollouts: torch is reseeded before each generation, with a new seed each repetition), interleaved
           repetitions of one step each. Train part = the step minus `_prepare_inputs` (generation, rewards):
           forward, backward, optimizer step. One thread pinned to one core (process CPU time), or `--threads 2` (wall
           time: CPU time adds the threads up). `--recipe`: another recipe's step (e.g. chain-full.yaml: full
           fine-tuning).
long tail  one micro-batch at the Qwen2.5-0.5B layer shape (hidden 896, 14 / 2 heads, MLP 4,864, LoRA r 16 on every
           linear layer) at a reduced size (`--layers`, vocabulary 32,768: the CPU's), random weights: `--rows` rows,
           prompts of 32-96 tokens, completions of up to `--max-completion` tokens drawn from Beta(1.2, 1.8) (mean 40 %
           of the maximum, a long right tail), TRL's layout (padded to the longest); the padded forward with TRL's
           fused LM head against `training.padding_free.PaddingFreeForward`, fwd + bwd, interleaved. `--shapes`: several
           (rows, longest completion); `--bins`: padding-free forwards with other bin targets beside the trainer's.
           `--device cuda`: the long tail only, at the full size (24 layers, Qwen2.5's vocabulary), bf16.

Printed per configuration: median seconds and the paired ratio (median, min, max), tokens computed per micro-step
and the padding among them, micro-steps, and the activations saved for the backward (MiB: the tensors autograd keeps,
a deterministic stand-in for the peak memory of a CPU step; on CUDA the allocator's peak), the long tail's largest
log-prob difference to the padded forward, and on CUDA the GPU kernels' seconds in one profiled forward + backward
against its wall seconds (a small share: the micro-step is bound by launch latency, not by its tokens).

    python -m benchmarks.step_cost.padding_free [--reps 7] [--threads 1|2] [--recipe YAML] [--skip-long-tail] \\
        [--quick]
    python -m benchmarks.step_cost.padding_free --device cuda --reps 30 --shapes 8x1024,16x1024,32x512 \\
        --bins big=4096
"""

import argparse
import os
import statistics
import tempfile
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from types import SimpleNamespace

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Qwen2Config
from trl.trainer.utils import add_fused_lm_head

from benchmarks.chain_testbed import chain_trainer, recipe_settings
from benchmarks.common import (
    DEVICES,
    QUIET_CPU_RUN,
    QWEN25_05B_CONFIG,
    check_device,
    interleaved_times,
    print_table,
    ratio_spread,
)
from grpo_hub import GRPOHubConfig
from grpo_hub.tasks import chain
from grpo_hub.training.padding_free import BIN_TOKENS, PaddingFreeForward

RECIPE = "recipes/configs/chain.yaml"
CONFIGS = {"padded": False, "padding-free": True}
HEADER = [
    "forwards",
    "train s",
    "ratio (min-max)",
    "tokens / micro-step",
    "padding",
    "micro-steps",
]  # + memory, ...
MIB = 2**20


class Work:
    """Tokens of every graph-building forward of `model` (inputs given labels: the scoring forwards), and the bytes of
    the activations autograd saves for the backward (the model's own parameters, saved by reference, left out)."""

    def __init__(self, model):
        self.tokens = self.forwards = self.rows = self.saved = self.peak_saved = 0
        self.parameters = {p.data_ptr() for p in model.parameters()}
        model.register_forward_pre_hook(self.count, with_kwargs=True)

    def count(self, module, args, kwargs):
        if torch.is_grad_enabled() and "labels" in kwargs:
            self.tokens += kwargs["input_ids"].numel()
            self.rows += kwargs["input_ids"].size(0)
            self.forwards += 1

    def saving(self):
        """Context: sum the bytes of the tensors autograd saves (a tensor saved twice counts twice)."""

        def pack(tensor):
            if tensor.data_ptr() not in self.parameters:
                self.saved += tensor.numel() * tensor.element_size()
            self.peak_saved = max(self.peak_saved, self.saved)
            return tensor

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)

    def reset_saved(self):
        self.saved = 0


def main_job_trainer(recipe: str, settings: dict):
    """The main job's trainer with `settings` over its recipe, learning rate 0 and a new batch each repetition (the
    same for every configuration)."""
    fields, lora = recipe_settings(recipe)
    prompts = fields.pop("num_prompts")
    args = GRPOHubConfig(**{**fields, **QUIET_CPU_RUN, "output_dir": tempfile.mkdtemp(), "learning_rate": 0.0,
                            "max_steps": 1, **settings})  # fmt: skip
    scorer = SimpleNamespace(reward=chain.chain_correctness_reward, attach=lambda trainer: None)  # no meter
    trainer = chain_trainer(args, scorer, lora, prompts, seed=0)
    score, drawn = trainer._generate_and_score_completions, [0]

    def reseeded(*args, **kwargs):
        drawn[0] += 1
        torch.manual_seed(1000 + drawn[0])
        return score(*args, **kwargs)

    trainer._generate_and_score_completions = reseeded
    return trainer


def metered_times(trainers: dict, reps: int, threads: int):
    """Interleaved step times of `trainers` (process CPU time on one thread, else wall time), with the real tokens of
    each training micro-batch, the activations each saves (`Work`) and the work of each step."""
    work = {name: Work(trainer.model) for name, trainer in trainers.items()}
    real = {name: [0] for name in trainers}
    for name, trainer in trainers.items():
        loss = trainer._compute_loss

        def counted(model, inputs, loss=loss, total=real[name], meter=work[name]):
            total[0] += int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
            meter.reset_saved()
            with meter.saving():
                return loss(model, inputs)

        trainer._compute_loss = counted
    clock = time.process_time if threads == 1 else time.perf_counter
    steps = {}
    return interleaved_times(trainers, reps, work=steps, clock=clock), real, work, steps


def measure_main_job(reps: int, threads: int, recipe: str = RECIPE) -> list[list[str]]:
    trainers = {name: main_job_trainer(recipe, {"padding_free": on}) for name, on in CONFIGS.items()}
    times, real, work, steps = metered_times(trainers, reps, threads)
    rows = []
    for name in trainers:
        train = [t for t, _ in times[name]]
        spread = ratio_spread(train, [t for t, _ in times["padded"]])
        meter = work[name]
        rows.append([
            name, f"{statistics.median(train):.3f}", f"{spread.median:.3f} ({spread.low:.3f}-{spread.high:.3f})",
            f"{meter.tokens / meter.forwards:,.0f}", f"{1 - real[name][0] / meter.tokens:.1%}",
            str(steps[name][0]), f"{meter.peak_saved / MIB:.1f}",
        ])  # fmt: skip
    return rows


def long_tail_batch(rows: int, max_completion: int, generator: torch.Generator, vocab: int):
    """TRL's layout of `rows` rows: left-padded prompts of 32-96 tokens, right-padded completions of Beta(1.2, 1.8)
    x `max_completion` tokens (at least 1), padded to the longest of each."""
    prompts = torch.randint(32, 97, (rows,), generator=generator)
    beta = torch.distributions.Beta(
        torch.tensor(1.2), torch.tensor(1.8)
    )  # draws from torch's global generator
    completions = (beta.sample((rows,)) * max_completion).long().clamp(min=1)
    width_p, width_c = int(prompts.max()), int(completions.max())
    ids = torch.randint(1, vocab, (rows, width_p + width_c), generator=generator)
    mask = torch.zeros_like(ids)
    for r in range(rows):
        mask[r, width_p - prompts[r] : width_p + completions[r]] = 1
    return ids, mask, width_c


def model_size(device: str, layers: int) -> tuple[int, int, torch.dtype]:
    """(layers, vocabulary, dtype) of `long_tail_model` on `device`: on CUDA (checked) the full Qwen2.5-0.5B in bf16,
    else `layers` layers, a 32,768-token vocabulary, fp32."""
    if device == "cuda":
        check_device("cuda")
        return QWEN25_05B_CONFIG["num_hidden_layers"], QWEN25_05B_CONFIG["vocab_size"], torch.bfloat16
    return layers, 32768, torch.float32


def long_tail_model(layers: int, vocab: int, device: str, dtype: torch.dtype):
    """The Qwen2.5-0.5B layer shape with `layers` layers and a `vocab`-token vocabulary, random weights (seed 0) in
    `dtype` on `device`, TRL's fused LM head, LoRA r 16 on every linear layer."""
    shape = {**QWEN25_05B_CONFIG, "num_hidden_layers": layers, "vocab_size": vocab}
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**shape, pad_token_id=0), dtype=dtype)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))


class PeakMemory:
    """Peak memory of one forward + backward: on CUDA the allocator's peak above what was allocated before it, on
    the CPU the activations autograd saves (`Work.saving`), a deterministic stand-in."""

    def __init__(self, device: str, work: Work):
        self.cuda, self.work = device == "cuda", work

    @contextmanager
    def measuring(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            yield
        else:
            self.work.peak_saved = 0
            self.work.reset_saved()
            with self.work.saving():
                yield

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated() - self.base if self.cuda else self.work.peak_saved


def padded_forward(model, ids, mask, keep) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's padded forward with its fused LM head: the log-probs and entropies of the last `keep` columns."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def forward_backward(run, ids, mask, keep) -> torch.Tensor:
    """One forward (`run`: log-probs and entropies) and its backward; the log-probs."""
    logps, entropies = run(ids, mask, keep)
    (logps.float().sum() + entropies.float().sum()).backward()
    return logps


def gpu_busy(run, ids, mask, keep) -> str:
    """Seconds the GPU's kernels ran during one `forward_backward` (torch.profiler) / its wall seconds: where the
    kernels fill a small share of the wall time, the micro-step is bound by launch latency, not by its tokens."""
    start = time.perf_counter()
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            forward_backward(run, ids, mask, keep)
            torch.cuda.synchronize()
    except Exception as error:  # a diagnosis only: the measured table stands without it
        return f"profiler failed: {type(error).__name__}: {error}"
    wall = time.perf_counter() - start
    kernels = sum(event.self_device_time_total for event in profile.key_averages()) / 1e6
    return f"{kernels:.3f} / {wall:.3f}"


def measure_long_tail(
    reps: int, rows: int, max_completion: int, layers: int, device: str = "cpu", dtype: torch.dtype = torch.float32,
    vocab: int = 32768, bins: dict[str, int] | None = None,
) -> list[list[str]]:  # fmt: skip
    """The padded forward against padding-free ones (`bins`: name -> `bin_tokens`; default the trainer's bins),
    fwd + bwd, interleaved; the first batch warms up and gives the largest log-prob difference to the padded one."""
    model = long_tail_model(layers, vocab, device, dtype)
    generator = torch.Generator().manual_seed(0)
    batches = [long_tail_batch(rows, max_completion, generator, vocab) for _ in range(reps + 1)]
    batches = [(ids.to(device), mask.to(device), keep) for ids, mask, keep in batches]

    def packed_with(bin_tokens):
        forward = PaddingFreeForward(0, nullcontext, bin_tokens)
        return lambda ids, mask, keep: forward(model, ids, mask, keep, compute_entropy=True)[:2]

    bins = bins or {"padding-free": BIN_TOKENS}
    runs = {
        "padded": partial(padded_forward, model),
        **{name: packed_with(tokens) for name, tokens in bins.items()},
    }
    times = {name: [] for name in runs}
    tokens = {name: 0 for name in runs}
    bin_rows = {name: 0 for name in runs}
    work = Work(model)
    memory = PeakMemory(device, work)
    peak, difference = {}, {}
    clock = time.process_time if device == "cpu" else time.perf_counter
    for rep, (ids, mask, keep) in enumerate(batches):
        names = list(runs) if rep % 2 == 0 else list(runs)[::-1]
        for name in names:
            model.zero_grad()
            work.tokens = work.rows = 0
            with memory.measuring():
                start = clock()
                logps = forward_backward(runs[name], ids, mask, keep)
                if device == "cuda":
                    torch.cuda.synchronize()
                elapsed = clock() - start
            if rep:  # the first batch warms up
                times[name].append(elapsed)
                tokens[name] += work.tokens
                bin_rows[name] += work.rows
                peak[name] = max(peak.get(name, 0), memory.peak())
            else:
                scored = mask[:, -keep:].bool()
                difference[name] = logps.detach().float()[scored]
    real = sum(int(mask.sum()) for _, mask, _ in batches[1:])
    ids, mask, keep = batches[-1]
    busy = {name: gpu_busy(run, ids, mask, keep) if device == "cuda" else "-" for name, run in runs.items()}
    table = []
    for name in runs:
        spread = ratio_spread(times[name], times["padded"])
        gap = (difference[name] - difference["padded"]).abs().max().item()
        table.append([
            name, f"{statistics.median(times[name]):.3f}",
            f"{spread.median:.3f} ({spread.low:.3f}-{spread.high:.3f})", f"{tokens[name] / reps:,.0f}",
            f"{1 - real / tokens[name]:.1%}", "1", f"{bin_rows[name] / reps:.1f}", f"{peak[name] / MIB:,.1f}",
            f"{gap:.2e}", busy[name],
        ])  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, choices=(1, 2), default=1)
    parser.add_argument("--recipe", default=RECIPE, help="main job: the recipe YAML whose step is measured")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="cuda: the long tail only, bf16, full size (24 layers, Qwen2.5's vocabulary)")  # fmt: skip
    parser.add_argument("--rows", type=int, default=8, help="long tail: rows of the micro-batch")
    parser.add_argument("--max-completion", type=int, default=512, help="long tail: longest completion")
    parser.add_argument(
        "--shapes", default="", help="long tail: ROWSxMAX_COMPLETION,... instead of the two above"
    )
    parser.add_argument("--layers", type=int, default=2, help="long tail: decoder layers")
    parser.add_argument(
        "--bins", default="", help="long tail: NAME=BIN_TOKENS,... (default: the trainer's bins)"
    )
    parser.add_argument("--skip-long-tail", action="store_true")
    parser.add_argument("--quick", action="store_true", help="2 repetitions, a 64-token long tail of 4 rows")
    cli = parser.parse_args()
    if cli.quick:
        cli.reps, cli.rows, cli.max_completion, cli.layers = 2, 4, 64, 1
    cuda = cli.device == "cuda"
    cli.layers, vocab, dtype = model_size(cli.device, cli.layers)
    if not cuda:
        if cli.threads == 1:
            os.sched_setaffinity(0, {0})
        torch.set_num_threads(cli.threads)
    if not cuda:
        print(
            f"## Main job ({cli.recipe}), one step per repetition, {cli.reps} repetitions, {cli.threads} thread(s)\n"
        )
        print_table([*HEADER, "saved MiB"], measure_main_job(cli.reps, cli.threads, cli.recipe))
    header = [
        *HEADER,
        "bins",
        "peak MiB" if cuda else "saved MiB",
        "max log-prob gap",
        "GPU kernels s / wall s",
    ]
    if cli.skip_long_tail:
        return
    shapes = [tuple(map(int, shape.split("x"))) for shape in cli.shapes.split(",") if shape] or [
        (cli.rows, cli.max_completion)
    ]
    bins = {name: int(tokens) for name, tokens in (item.split("=") for item in cli.bins.split(",") if item)}
    if not cuda:
        torch.set_num_threads(1)
    for rows, max_completion in shapes:
        print(f"\n## Long tail: {rows} rows, completions up to {max_completion} tokens (mean 40 %), {cli.layers} "
              f"Qwen2.5-0.5B-shaped layers, vocabulary {vocab:,}, {dtype}, {cli.device}"
              f"{'' if cuda else ', one thread'}\n")  # fmt: skip
        print_table(header, measure_long_tail(cli.reps, rows, max_completion, cli.layers, cli.device, dtype, vocab,
                                              bins))  # fmt: skip
        if cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
