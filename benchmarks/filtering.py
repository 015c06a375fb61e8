"""Zero-signal filtering benchmark: plain TRL vs grpo_hub in one process, same model, data and seeds.

Half of the prompts get a constant reward, so half of the groups carry no signal. Three trainers run
interleaved repetitions of a few optimizer steps each:
  trl      - trl.GRPOTrainer
  hub-off  - GRPOHubTrainer with every extra feature off (overhead of the plugin)
  hub-filt - GRPOHubTrainer with filter_zero_signal=True
Measured: the training part of each step (forward + backward + optimizer, i.e. `training_step` minus the
generation/scoring inside `_prepare_inputs`), and the whole step. learning_rate=0 keeps the three models
identical, so every trainer generates the same completions. Times are process CPU time (torch runs on one
thread), which a shared, overloaded machine disturbs far less than wall-clock time. Run:

    python benchmarks/filtering.py [--reps 7] [--steps 4]
"""

import argparse
import statistics
import tempfile
import time

import torch
from datasets import Dataset
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer

from grpo_hub.config import GRPOHubConfig
from grpo_hub.tasks import build_tiny_model
from grpo_hub.trainer import GRPOHubTrainer

MODEL_SHAPE = {  # big enough that the training forward/backward dominates Python overhead
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}


def half_signal_dataset(n: int = 64) -> Dataset:
    prompts = [f"Write only digits: {i % 10}" if i % 2 == 0 else f"Stay quiet: {i % 10}" for i in range(n)]
    return Dataset.from_dict({"prompt": prompts})


def half_signal_reward(prompts, completions, completion_ids, **kwargs):
    """0.0 for the "Stay quiet" half (zero-signal groups); completion-dependent otherwise."""
    return [
        0.0 if p.startswith("Stay") else (sum(ids) % 7) / 7
        for p, ids in zip(prompts, completion_ids, strict=True)
    ]


def make_model(tokenizer):
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        **MODEL_SHAPE,
    )
    return Qwen2ForCausalLM(config)


class StepTimer:
    """Wraps a trainer's `training_step` and `_prepare_inputs` to split each step into train / generation time.

    Also reseeds torch before every generation, so all trainers sample the same completions (their RNG
    use differs in between: TRL shuffles 16 rows for grpo_hub's filtered batch, 32 for the full one).
    """

    def __init__(self, trainer):
        self.train, self.total = 0.0, 0.0
        self._in_prepare = 0.0
        self._generations = 0
        step, prepare, score = (
            trainer.training_step,
            trainer._prepare_inputs,
            trainer._generate_and_score_completions,
        )

        def seeded_score(*args, **kwargs):
            self._generations += 1
            torch.manual_seed(self._generations)
            return score(*args, **kwargs)

        def timed_prepare(*args, **kwargs):
            start = time.process_time()
            out = prepare(*args, **kwargs)
            self._in_prepare += time.process_time() - start
            return out

        def timed_step(*args, **kwargs):
            self._in_prepare = 0.0
            start = time.process_time()
            out = step(*args, **kwargs)
            elapsed = time.process_time() - start
            self.total += elapsed
            self.train += elapsed - self._in_prepare
            return out

        trainer.training_step, trainer._prepare_inputs = timed_step, timed_prepare
        trainer._generate_and_score_completions = seeded_score

    def take(self) -> tuple[float, float]:
        out = (self.train, self.total)
        self.train, self.total, self._generations = 0.0, 0.0, 0
        return out


def build(kind: str, tokenizer, dataset, steps: int, out_dir: str):
    common = {
        "output_dir": out_dir,
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "log_level": "error",
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 2,
        "num_generations": 4,
        "max_completion_length": 64,
        "learning_rate": 0.0,
        "max_steps": steps,
        "logging_steps": 1000,
        "shuffle_dataset": False,
        "seed": 0,
    }
    if kind == "trl":
        trainer_cls, args = GRPOTrainer, GRPOConfig(**common)
    else:
        trainer_cls, args = GRPOHubTrainer, GRPOHubConfig(filter_zero_signal=kind == "hub-filt", **common)
    trainer = trainer_cls(
        model=make_model(tokenizer),
        reward_funcs=[half_signal_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    return trainer, StepTimer(trainer)


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f}  min {min(values):.3f}  max {max(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per repetition")
    cli = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    dataset = half_signal_dataset()
    kinds = ("trl", "hub-off", "hub-filt")
    with tempfile.TemporaryDirectory() as out_dir:
        runs = {kind: build(kind, tokenizer, dataset, cli.steps, out_dir) for kind in kinds}
        for trainer, _ in runs.values():  # warm-up, not measured
            trainer.train()
        for _, timer in runs.values():
            timer.take()  # discard the warm-up
        times = {kind: [] for kind in kinds}
        for rep in range(cli.reps):
            order = kinds[rep % 3 :] + kinds[: rep % 3]  # interleaved and rotated: load drift hits all alike
            for kind in order:
                trainer, timer = runs[kind]
                trainer.train()
                times[kind].append(timer.take())
    rows_trl = [t for t, _ in times["trl"]]
    print(f"{cli.reps} repetitions x {cli.steps} optimizer steps, {MODEL_SHAPE['hidden_size']}-wide model")
    for kind in kinds:
        print(f"{kind:9s} train s/rep: {summary([t for t, _ in times[kind]])}")
    ratio = {kind: [t / b for (t, _), b in zip(times[kind], rows_trl, strict=True)] for kind in kinds[1:]}
    whole = {
        kind: [t / b for (_, t), (_, b) in zip(times[kind], times["trl"], strict=True)] for kind in kinds[1:]
    }
    print(f"train-step time ratio hub-filt / trl (goal <= 0.55): {summary(ratio['hub-filt'])}")
    print(f"overhead ratio hub-off / trl, train part (goal <= 1.02): {summary(ratio['hub-off'])}")
    print(f"overhead ratio hub-off / trl, whole step incl. generation: {summary(whole['hub-off'])}")
    print(f"whole-step ratio hub-filt / trl incl. generation: {summary(whole['hub-filt'])}")


if __name__ == "__main__":
    main()
