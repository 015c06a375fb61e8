"""Shared benchmark harness: random models, exact zero-signal data, trainers, interleaved timing, ratio tables.

Every benchmark runs plain `trl.GRPOTrainer` and `GRPOHubTrainer` side by side in one process on the same
model weights, data and seeds. Repetitions are interleaved (and their order rotated), so drifting machine
load hits every trainer alike, and results are printed as ratios to TRL with their spread.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from grpo_hub.config.config_files import read_config
from grpo_hub.config.hub_config import GRPOHubConfig
from grpo_hub.tasks import build_tiny_model
from grpo_hub.tasks.tiny_model import MODEL_SHAPE
from grpo_hub.training.trainer import GRPOHubTrainer

# The recipe's settings for the random tiny model (`recipes/grpo.py --task digits`), read from its preset.
SMOKE_SETTINGS = read_config(Path(__file__).resolve().parents[1] / "recipes" / "configs" / "grpo.yaml")
# Big enough that the training forward/backward dominates per-step Python overhead on a CPU core.
MEDIUM_SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
# --quick: seconds, not minutes. The offline tiny model's shape, at Qwen2's default initialisation.
TINY_SHAPE = {key: value for key, value in MODEL_SHAPE.items() if key != "initializer_range"}
QWEN25_05B_CONFIG = {  # Qwen/Qwen2.5-0.5B config.json (the shape only; weights are random)
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}
# Trainer kinds: plain TRL, grpo_hub with every extra feature off, grpo_hub with zero-signal filtering (kept
# rows packed into fewer micro-steps, the default), and filtering with every micro-step run, thinner.
TRL, HUB_OFF, HUB_FILTER, HUB_FILTER_THIN = "trl", "hub-off", "hub-filter", "hub-filter-thin"
DEVICES = ("cpu", "cuda")
# GRPOConfig fields of a benchmark's training run on CPU: fp32, nothing saved, reported or printed, every step logged.
QUIET_CPU_RUN = {
    "use_cpu": True,
    "bf16": False,
    "report_to": "none",
    "save_strategy": "no",
    "disable_tqdm": True,
    "log_level": "error",
    "logging_steps": 1,
}
GROUP_SIZE = 4


def load_tokenizer():
    """The offline 512-token byte-level BPE of the tiny test model (no download)."""
    return AutoTokenizer.from_pretrained(build_tiny_model())


def random_model(tokenizer, shape: dict, seed: int = 0) -> Qwen2ForCausalLM:
    """A Qwen2 causal LM of `shape` with random weights drawn from `seed` (fp32, tied embeddings, the
    tokenizer's vocabulary unless `shape` sets vocab_size)."""
    torch.manual_seed(seed)
    settings = {
        "vocab_size": len(tokenizer),
        "tie_word_embeddings": True,
        **shape,
    }  # shape may size the vocab
    config = Qwen2Config(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **settings)
    return Qwen2ForCausalLM(config)


def zero_signal_dataset(zero_fraction: float, groups_per_batch: int, batches: int) -> Dataset:
    """Prompts where exactly `zero_fraction` of the groups of every generation batch get a constant reward.

    Column `signal` marks the prompts whose groups get a varying reward; with `shuffle_dataset=False` each
    generation batch reads `groups_per_batch` consecutive prompts, so the fraction holds batch by batch.
    """
    zero_groups = zero_fraction * groups_per_batch
    if zero_groups != int(zero_groups):
        raise ValueError(f"zero_fraction={zero_fraction} x {groups_per_batch} groups is not a whole number")
    signal = [i >= int(zero_groups) for i in range(groups_per_batch)] * batches
    prompts = [f"Write only digits: {i % 10}" for i in range(len(signal))]
    return Dataset.from_dict({"prompt": prompts, "signal": signal})


def group_position_reward(prompts, completions, signal, **kwargs) -> list[float]:
    """0.0 on zero-signal prompts; the completion's position in its group on the others (spread exactly > 0).

    TRL scores the completions of one prompt as consecutive rows, so `i % GROUP_SIZE` is the position.
    """
    return [float(i % GROUP_SIZE) if keep else 0.0 for i, keep in enumerate(signal)]


def check_device(device: str) -> None:
    """SystemExit with the fix when `device` is "cuda" and torch sees no CUDA GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"--device cuda: torch {torch.__version__} sees no CUDA GPU. Run on a machine with one (and a CUDA "
            "build of torch), or use --device cpu."
        )


def use_device(device: str) -> None:
    """`check_device`, and on CPU one torch thread (process CPU time then measures one core's work)."""
    check_device(device)
    if device == "cpu":
        torch.set_num_threads(1)


def grpo_args(kind: str, output_dir: str, device: str = "cpu", **settings) -> GRPOConfig:
    """Config for `kind` (CPU: fp32; CUDA: bf16); `settings` are the GRPOConfig fields shared by every kind."""
    common = {
        "output_dir": output_dir,
        "use_cpu": device == "cpu",
        "bf16": device == "cuda",
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "log_level": "error",
        "logging_steps": 1000,
        "shuffle_dataset": False,
        "seed": 0,
        "num_generations": GROUP_SIZE,
        **settings,
    }
    if kind == TRL:
        return GRPOConfig(**common)
    filtering = kind in (HUB_FILTER, HUB_FILTER_THIN)
    return GRPOHubConfig(
        filter_zero_signal=filtering, zero_signal_pack=False if kind == HUB_FILTER_THIN else None, **common
    )


def build_trainer(kind: str, args: GRPOConfig, **trainer_kwargs):
    """`trl.GRPOTrainer` for kind "trl", else `GRPOHubTrainer`; no metrics printed at the end of `train()`."""
    trainer_cls = GRPOTrainer if kind == TRL else GRPOHubTrainer
    trainer = trainer_cls(args=args, **trainer_kwargs)
    trainer.remove_callback(PrinterCallback)
    return trainer


class StepTimer(TrainerCallback):
    """Splits a trainer's optimizer steps into training time and whole-step time, in process CPU seconds.

    whole step = time from `on_step_begin` to `on_step_end`: generation and scoring, forward, backward and
                 the optimizer step (TRL's logged `step_time` metric sums the wall time of `training_step`
                 calls instead, which leaves out the optimizer step);
    training   = that minus the time spent in `_prepare_inputs`, i.e. without generation, reward scoring,
                 old/ref log-probs and grpo_hub's row dropping.
    CPU time (`time.process_time`, torch on one thread) is what a shared, overloaded machine disturbs least:
    wall time also counts the slices the scheduler gives to other processes. `clock` replaces it (e.g.
    `time.perf_counter` for wall time with several threads, where CPU time adds the threads up).
    Torch is also reseeded before every generation, so every trainer samples the same completions although
    their RNG use differs in between (TRL shuffles fewer rows after filtering).
    """

    def __init__(self, trainer, device: str = "cpu", clock=None):
        self.train, self.total = 0.0, 0.0
        self.micro_steps, self.rows, self.peak_bytes = 0, 0, 0
        self._started, self._in_prepare, self._generations = 0.0, 0.0, 0
        self._device = device
        self.clock = clock or (time.process_time if device == "cpu" else _synchronized_wall_clock)
        prepare, score = trainer._prepare_inputs, trainer._generate_and_score_completions

        def count_training_forward(module, args, kwargs):
            if torch.is_grad_enabled():  # TRL's scoring forwards run under no_grad
                self.micro_steps += 1
                self.rows += kwargs["input_ids"].shape[0]

        trainer.model.register_forward_pre_hook(count_training_forward, with_kwargs=True)

        def seeded_score(*args, **kwargs):
            self._generations += 1
            torch.manual_seed(self._generations)
            return score(*args, **kwargs)

        def timed_prepare(*args, **kwargs):
            start = self.clock()
            out = prepare(*args, **kwargs)
            self._in_prepare += self.clock() - start
            return out

        trainer._prepare_inputs, trainer._generate_and_score_completions = timed_prepare, seeded_score
        trainer.add_callback(self)

    def on_train_begin(self, args, state, control, **kwargs):
        if self._device == "cuda":
            torch.cuda.reset_peak_memory_stats()

    def on_train_end(self, args, state, control, **kwargs):
        if self._device == "cuda":
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated())

    def on_step_begin(self, args, state, control, **kwargs):
        self._in_prepare = 0.0
        self._started = self.clock()

    def on_step_end(self, args, state, control, **kwargs):
        elapsed = self.clock() - self._started
        self.total += elapsed
        self.train += elapsed - self._in_prepare

    def take(self) -> tuple[float, float]:
        """(training seconds, whole-step seconds) since the last call; resets those and the work counters."""
        out = (self.train, self.total)
        self.train, self.total, self._generations = 0.0, 0.0, 0
        self.micro_steps, self.rows = 0, 0
        return out


def count_trained_rows(trainer, add: Callable[[int], None]) -> None:
    """Call `add(rows)` at each of `trainer`'s policy forwards with gradients (its training forwards, one per
    micro-step), `rows` in TRL's layout: padding_free packs a micro-batch's rows into fewer model rows, so a model hook
    would count its bins."""
    forward = trainer._get_per_token_logps_and_entropies

    def counted(model, input_ids, *args, **kwargs):
        if torch.is_grad_enabled():  # scoring forwards run under no_grad
            add(input_ids.shape[0])
        return forward(model, input_ids, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counted


def _synchronized_wall_clock() -> float:
    """Wall time after the GPU finished the queued work (CUDA kernels run asynchronously)."""
    torch.cuda.synchronize()
    return time.perf_counter()


def interleaved_times(
    trainers: dict,
    reps: int,
    device: str = "cpu",
    work: dict | None = None,
    peaks: dict | None = None,
    clock=None,
) -> dict[str, list[tuple[float, float]]]:
    """Run `trainer.train()` once for warm-up, then `reps` interleaved times; {name: [(train s, total s)]}.

    The order of the trainers is rotated every repetition, so no trainer always runs first or last. CPU:
    process CPU time; CUDA: wall time with `torch.cuda.synchronize`. When given, `work` receives {name:
    (training micro-steps, rows trained)} of one repetition and `peaks` {name: peak CUDA bytes allocated}. `clock`:
    `StepTimer`'s.
    """
    timers = {name: StepTimer(trainer, device, clock) for name, trainer in trainers.items()}
    for name, trainer in trainers.items():
        trainer.train()
        timers[name].take()  # warm-up, discarded
    names = list(trainers)
    times = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            trainers[name].train()
            if work is not None:
                work[name] = (timers[name].micro_steps, timers[name].rows)
            times[name].append(timers[name].take())
    if peaks is not None:
        peaks.update({name: timer.peak_bytes for name, timer in timers.items()})
    return times


@dataclass
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> "Spread":
        return cls(statistics.median(values), min(values), max(values))


def ratio_spread(times: list[float], baseline: list[float]) -> Spread:
    """Spread of the per-repetition ratios times[i] / baseline[i] (paired: same repetition, same load)."""
    return Spread.of([t / b for t, b in zip(times, baseline, strict=True)])


def print_table(header: list[str], rows: list[list[str]], right: bool = True) -> None:
    """Print a Markdown table, its columns after the first right-aligned (`right`) or all left-aligned."""
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 or not right else "---:" for i in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def spread_cells(spread: Spread) -> list[str]:
    """Median, min and max as three table cells."""
    return [f"{spread.median:.3f}", f"{spread.low:.3f}", f"{spread.high:.3f}"]
