"""Padding-free forwards (`padding_free`) against TRL's padded ones: the trainer's forward + backward per step, the
tokens it computes, and the activations it keeps for the backward.

main job   the LoRA main job (`recipes/configs/chain.yaml`: the shipped chain model, 8 problems x 8 completions of up
           to 48 tokens, one 64-row micro-batch), `GRPOHubTrainer` with padding_free off and on, learning rate 0 (the
           same rollouts: torch is reseeded before each generation, with a new seed each repetition), interleaved
           repetitions of one step each. Train part = the step minus `_prepare_inputs` (generation, rewards):
           forward, backward, optimizer step. One thread pinned to one core (process CPU time), or `--threads 2` (wall
           time: CPU time adds the threads up).
long tail  one micro-batch at the Qwen2.5-0.5B layer shape (hidden 896, 14 / 2 heads, MLP 4,864, LoRA r 16 on every
           linear layer) at a reduced size (`--layers`, vocabulary 32,768: the CPU's), random weights: `--rows` rows,
           prompts of 32-96 tokens, completions of up to `--max-completion` tokens drawn from Beta(1.2, 1.8) (mean 40 %
           of the maximum, a long right tail), TRL's layout (padded to the longest); the padded forward with TRL's
           fused LM head against `training.padding_free.PaddingFreeForward`, fwd + bwd, interleaved.

Printed per configuration: median seconds and the paired ratio (median, min, max), tokens computed per micro-step
and the padding among them, micro-steps, and the activations saved for the backward (MiB: the tensors autograd keeps,
a deterministic stand-in for the peak memory of a CPU step).

    python -m benchmarks.padding_free [--reps 7] [--threads 1|2] [--skip-long-tail] [--quick]
"""

import argparse
import os
import statistics
import tempfile
import time
from contextlib import nullcontext
from types import SimpleNamespace

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Qwen2Config
from trl.trainer.utils import add_fused_lm_head

from benchmarks.common import QUIET_CPU_RUN, QWEN25_05B_CONFIG, interleaved_times, print_table, ratio_spread
from benchmarks.time_to_accuracy import chain_trainer, recipe_settings
from grpo_hub import GRPOHubConfig
from grpo_hub.tasks import chain
from grpo_hub.training.padding_free import PaddingFreeForward

RECIPE = "recipes/configs/chain.yaml"
CONFIGS = {"padded": False, "padding-free": True}
MIB = 2**20


class Work:
    """Tokens of every graph-building forward of `model` (inputs given labels: the scoring forwards), and the bytes of
    the activations autograd saves for the backward (the model's own parameters, saved by reference, left out)."""

    def __init__(self, model):
        self.tokens = self.forwards = self.saved = self.peak_saved = 0
        self.parameters = {p.data_ptr() for p in model.parameters()}
        model.register_forward_pre_hook(self.count, with_kwargs=True)

    def count(self, module, args, kwargs):
        if torch.is_grad_enabled() and "labels" in kwargs:
            self.tokens += kwargs["input_ids"].numel()
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


def main_job_trainer(padding_free: bool):
    fields, lora = recipe_settings(RECIPE)
    prompts = fields.pop("num_prompts")
    args = GRPOHubConfig(**{**fields, **QUIET_CPU_RUN, "output_dir": tempfile.mkdtemp(), "learning_rate": 0.0,
                            "max_steps": 1, "padding_free": padding_free})  # fmt: skip
    scorer = SimpleNamespace(reward=chain.chain_correctness_reward, attach=lambda trainer: None)  # no meter
    trainer = chain_trainer(args, scorer, lora, prompts, seed=0)
    score, drawn = trainer._generate_and_score_completions, [0]

    def reseeded(*args, **kwargs):  # a new batch every repetition, the same for both configurations
        drawn[0] += 1
        torch.manual_seed(1000 + drawn[0])
        return score(*args, **kwargs)

    trainer._generate_and_score_completions = reseeded
    return trainer


def measure_main_job(reps: int, threads: int) -> list[list[str]]:
    trainers = {name: main_job_trainer(on) for name, on in CONFIGS.items()}
    work = {name: Work(trainer.model) for name, trainer in trainers.items()}
    real = {name: [0] for name in trainers}
    for name, trainer in trainers.items():  # the real tokens of each training micro-batch
        loss = trainer._compute_loss

        def counted(model, inputs, loss=loss, total=real[name], meter=work[name]):
            total[0] += int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
            meter.reset_saved()
            with meter.saving():
                return loss(model, inputs)

        trainer._compute_loss = counted
    clock = time.process_time if threads == 1 else time.perf_counter
    steps = {}
    times = interleaved_times(trainers, reps, work=steps, clock=clock)
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


def measure_long_tail(reps: int, rows: int, max_completion: int, layers: int) -> list[list[str]]:
    shape = {**QWEN25_05B_CONFIG, "num_hidden_layers": layers, "vocab_size": 32768}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**shape, pad_token_id=0))
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    generator = torch.Generator().manual_seed(0)
    batches = [long_tail_batch(rows, max_completion, generator, shape["vocab_size"]) for _ in range(reps + 1)]
    packed_forward = PaddingFreeForward(0, nullcontext)

    def padded(ids, mask, keep):
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :-keep] = -100
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        return out.log_probs[:, -keep:], out.entropy[:, -keep:]

    def packed(ids, mask, keep):
        return packed_forward(model, ids, mask, keep, compute_entropy=True)[:2]

    runs = {"padded": padded, "padding-free": packed}
    times = {name: [] for name in runs}
    tokens = {name: 0 for name in runs}
    work = Work(model)
    saved = {}
    for rep, (ids, mask, keep) in enumerate(batches):
        names = list(runs) if rep % 2 == 0 else list(runs)[::-1]
        for name in names:
            model.zero_grad()
            work.tokens = work.peak_saved = 0
            work.reset_saved()
            start = time.process_time()
            with work.saving():
                logps, entropies = runs[name](ids, mask, keep)
            (logps.sum() + entropies.sum()).backward()
            if rep:  # the first batch warms up
                times[name].append(time.process_time() - start)
                tokens[name] += work.tokens
                saved[name] = max(saved.get(name, 0), work.peak_saved)
    real = sum(int(mask.sum()) for _, mask, _ in batches[1:])
    table = []
    for name in runs:
        spread = ratio_spread(times[name], times["padded"])
        table.append([
            name, f"{statistics.median(times[name]):.3f}",
            f"{spread.median:.3f} ({spread.low:.3f}-{spread.high:.3f})", f"{tokens[name] / reps:,.0f}",
            f"{1 - real / tokens[name]:.1%}", "1", f"{saved[name] / MIB:.1f}",
        ])  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, choices=(1, 2), default=1)
    parser.add_argument("--rows", type=int, default=8, help="long tail: rows of the micro-batch")
    parser.add_argument("--max-completion", type=int, default=512, help="long tail: longest completion")
    parser.add_argument("--layers", type=int, default=2, help="long tail: decoder layers")
    parser.add_argument("--skip-long-tail", action="store_true")
    parser.add_argument("--quick", action="store_true", help="2 repetitions, a 64-token long tail of 4 rows")
    cli = parser.parse_args()
    if cli.quick:
        cli.reps, cli.rows, cli.max_completion, cli.layers = 2, 4, 64, 1
    if cli.threads == 1:
        os.sched_setaffinity(0, {0})
    torch.set_num_threads(cli.threads)
    header = ["forwards", "train s", "ratio (min-max)", "tokens / micro-step", "padding", "micro-steps",
              "saved MiB"]  # fmt: skip
    print(f"## Main job, one step per repetition, {cli.reps} repetitions, {cli.threads} thread(s)\n")
    print_table(header, measure_main_job(cli.reps, cli.threads))
    if not cli.skip_long_tail:
        print(f"\n## Long tail: {cli.rows} rows, completions up to {cli.max_completion} tokens (mean 40 %), "
              f"{cli.layers} Qwen2.5-0.5B-shaped layers, one thread\n")  # fmt: skip
        torch.set_num_threads(1)
        print_table(header, measure_long_tail(cli.reps, cli.rows, cli.max_completion, cli.layers))


if __name__ == "__main__":
    main()
