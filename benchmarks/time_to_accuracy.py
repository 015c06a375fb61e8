"""Time to accuracy on the chain task: how soon does each configuration reach plain TRL's held-out accuracy?

Every configuration trains the shipped chain model (`grpo_hub.tasks.chain_model`) with the LoRA settings of
`recipes/configs/chain.yaml` for the same budget of process CPU seconds (one core, one torch thread; on an
otherwise idle core that is its wall time, and other load on a shared machine disturbs it least). Prompts cycle
through the recipe's training set epoch after epoch, so a configuration that skips prompts moves on to others
instead of running out (and selective rollout sees each prompt again, as in multi-epoch reasoning RL).
Held-out accuracy (greedy, 2,000 problems, standard error <= 1.1 points) is evaluated off the clock at fixed
points of the budget. Runs are interleaved: seed-major, the configuration order rotated per seed.

Target: plain TRL's final accuracy, averaged over seeds. Reached (smoothing rule): the first evaluation point
whose accuracy and the next point's are both >= the target (at the last point, that point alone), so one
noisy evaluation cannot fake a crossing. Ratio: a configuration's time to the target / plain TRL's, per seed.

    python -m benchmarks.time_to_accuracy [--seeds 3] [--budget 300] [--points 6] [--plot docs/time-to-accuracy.png]
    python -m benchmarks.time_to_accuracy --quick     # smoke run: 1 seed, 2 configurations, 10 s (numbers are noise)

On the 2-core VM the seeds can run as two such processes, one per core (`--seed-list 0,2 --core 0 --json a.json`,
`--seed-list 1 --core 1 --json b.json`), then `--merge a.json b.json --plot ...` prints the joint report.
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from benchmarks.common import QUIET_CPU_RUN
from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.algos.advantages import ALL_MAX, ALL_MIN, zero_signal_kinds
from grpo_hub.tasks import chain
from grpo_hub.tasks.chain_model import chain_model_path

RECIPE = "recipes/configs/chain.yaml"
PRESET = "recipes/configs/chain-fast.yaml"
CONFIGS = {
    "trl": None,
    "filter": {"filter_zero_signal": True},  # kept rows packed into fewer micro-steps (the default)
    # the same with TRL's loss normaliser: TRL's gradient exactly, each step cheaper (docs/filtering.md)
    "filter-all": {"filter_zero_signal": True, "zero_signal_normalizer": "all"},
    "dynamic": {"dynamic_sampling": True},
    "selective": {"selective_rollout": True},
    "selective+dynamic": {"selective_rollout": True, "dynamic_sampling": True},
}  # + "chain-fast": the recommended preset, read from its YAML
LORA_KEYS = {"lora_r": "r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout"}
RECIPE_ONLY = {"task", "use_peft", "lora_target_modules", "logging_steps", "output_dir"}


def recipe_settings(path: str) -> tuple[dict, LoraConfig]:
    """(GRPOConfig fields, LoRA config) of a recipe YAML; the recipe's own keys are left out."""
    settings = yaml.safe_load(Path(path).read_text())
    lora = LoraConfig(
        task_type="CAUSAL_LM",
        target_modules=settings.get("lora_target_modules", "all-linear"),
        **{LORA_KEYS[k]: settings[k] for k in LORA_KEYS if k in settings},
    )
    fields = {k: v for k, v in settings.items() if k not in RECIPE_ONLY and k not in LORA_KEYS}
    return fields, lora


class Meter(TrainerCallback):
    """Training clock (process CPU s, evaluations excluded), held-out accuracy at fixed points, work counters.

    `points`: one dict per evaluation: time, wall, accuracy (per level), generated tokens / rows, trained rows,
    micro-steps, optimizer steps, and the shares of all-correct / all-wrong groups generated since the last point.
    """

    def __init__(self, tokenizer, eval_times: list[float], group_size: int, per_level: int):
        self.tokenizer, self.eval_times, self.group_size = tokenizer, list(eval_times), group_size
        self.per_level = per_level
        self.points, self.gen_seconds = [], 0.0
        self.tokens = self.rows = self.trained_rows = self.micro_steps = 0
        self.groups = {"all_correct": 0, "all_wrong": 0, "total": 0}
        self._paused, self._start, self._wall_start = 0.0, 0.0, 0.0

    def attach(self, trainer) -> None:
        """Count the trainer's training forwards and time its generation; receive its callbacks."""

        def count_training_forward(module, args, kwargs):
            if torch.is_grad_enabled():  # scoring forwards run under no_grad
                self.micro_steps += 1
                self.trained_rows += kwargs["input_ids"].shape[0]

        trainer.model.register_forward_pre_hook(count_training_forward, with_kwargs=True)
        generate = trainer._generate

        def timed_generate(*args, **kwargs):
            start = time.process_time()
            out = generate(*args, **kwargs)
            self.gen_seconds += time.process_time() - start
            return out

        trainer._generate = timed_generate
        trainer.add_callback(self)

    def reward(self, prompts, completions, answer, completion_ids, **kwargs):
        """`chain_correctness_reward`, counting generated rows / tokens and all-correct / all-wrong groups."""
        rewards = chain.chain_correctness_reward(prompts, completions, answer)
        self.rows += len(completions)
        self.tokens += sum(len(ids) for ids in completion_ids)
        kinds = zero_signal_kinds(torch.tensor(rewards), self.group_size, eps=0.0, low=0.0, high=1.0)
        self.groups["total"] += kinds.numel()
        self.groups["all_correct"] += int((kinds == ALL_MAX).sum())
        self.groups["all_wrong"] += int((kinds == ALL_MIN).sum())
        return rewards

    def elapsed(self) -> float:
        return time.process_time() - self._start - self._paused

    def _evaluate(self, model, step: int) -> None:
        paused_at, elapsed = time.process_time(), self.elapsed()
        rng = torch.get_rng_state()  # the evaluation must not change the training's random stream
        accuracy = chain.evaluate(model, self.tokenizer, n=self.per_level)["greedy"]
        torch.set_rng_state(rng)
        model.train()
        total = max(self.groups["total"], 1)
        self.points.append(
            {
                "time": round(elapsed, 2),
                "wall": round(time.perf_counter() - self._wall_start, 2),
                "accuracy": accuracy,
                "generated_tokens": self.tokens,
                "generated_rows": self.rows,
                "trained_rows": self.trained_rows,
                "micro_steps": self.micro_steps,
                "optimizer_steps": step,
                "generation_seconds": round(self.gen_seconds, 2),
                "all_correct": round(self.groups["all_correct"] / total, 4),
                "all_wrong": round(self.groups["all_wrong"] / total, 4),
            }
        )
        self.groups = dict.fromkeys(self.groups, 0)
        self._paused += time.process_time() - paused_at

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._start, self._wall_start = time.process_time(), time.perf_counter()
        self._evaluate(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.eval_times and self.elapsed() >= self.eval_times[0]:
            self.eval_times.pop(0)
            self._evaluate(model, state.global_step)
            control.should_training_stop = not self.eval_times


def run(name: str, seed: int, budget: float, points: int, extra: dict | None, per_level: int) -> list[dict]:
    """Train configuration `name` for `budget` CPU seconds; return its evaluation points."""
    fields, lora = recipe_settings(RECIPE)
    prompts = fields.pop("num_prompts")
    model_dir = chain_model_path()
    common = {
        **fields,
        "output_dir": tempfile.mkdtemp(),
        **QUIET_CPU_RUN,
        "max_steps": 100_000,  # the budget stops training
        "seed": seed,
    }
    args = GRPOConfig(**common) if extra is None else GRPOHubConfig(**common, **extra)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eval_times = [budget * (i + 1) / points for i in range(points)]
    meter = Meter(tokenizer, eval_times, args.num_generations, per_level)
    torch.manual_seed(seed)
    trainer = (GRPOTrainer if extra is None else GRPOHubTrainer)(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[meter.reward],
        args=args,
        train_dataset=chain.load_chain("train", n=prompts, seed=0),
        processing_class=tokenizer,
        peft_config=lora,
    )
    meter.attach(trainer)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return meter.points


def reached_at(points: list[dict], target: float) -> float | None:
    """Time of the first point at or above `target` whose next point is too (the last point: alone); None if never."""
    acc = [p["accuracy"]["all"] for p in points]
    for i, value in enumerate(acc):
        if value >= target and (i == len(acc) - 1 or acc[i + 1] >= target):
            return points[i]["time"]
    return None


def summarize(results: dict) -> dict:
    """Per configuration: final accuracy per seed, time to the target per seed, ratios to TRL, work at the end."""
    target = statistics.fmean(runs[-1]["accuracy"]["all"] for runs in results["trl"])
    trl_times = [reached_at(runs, target) for runs in results["trl"]]
    table = {}
    for name, seeds in results.items():
        times = [reached_at(runs, target) for runs in seeds]
        ratios = [
            t / base if t is not None and base else None for t, base in zip(times, trl_times, strict=True)
        ]
        finals = [runs[-1] for runs in seeds]
        table[name] = {
            "final_accuracy": [p["accuracy"]["all"] for p in finals],
            "time_to_target": times,
            "ratio_to_trl": ratios,
            "median_ratio": statistics.median(ratios) if None not in ratios else None,
            **{
                key: statistics.median(p[key] for p in finals)
                for key in (
                    "generated_tokens",
                    "generated_rows",
                    "trained_rows",
                    "micro_steps",
                    "optimizer_steps",
                )
            },
            "generation_share": statistics.median(p["generation_seconds"] / p["time"] for p in finals),
        }
    return {"target": round(target, 4), "configs": table}


def _fmt(values, spec=".2f") -> str:
    return " / ".join("never" if v is None else format(v, spec) for v in values)


def print_report(results: dict, summary: dict, header: str) -> None:
    print(header)
    print(f"target = plain TRL's final held-out accuracy, mean over seeds: {summary['target']:.4f}")
    trl = summary["configs"]["trl"]
    print(
        "| config | final accuracy (per seed) | time to target s (per seed) | ratio to TRL (per seed) | median ratio "
        "| generated tokens | generated rows | trained rows | micro-steps | optimizer steps | generation share |"
    )
    print("|---" * 11 + "|")
    for name, row in summary["configs"].items():
        median = "never (some seed)" if row["median_ratio"] is None else f"**{row['median_ratio']:.2f}**"
        work = " | ".join(
            f"{row[k]:.0f} ({row[k] / trl[k]:.2f}×)"
            for k in ("generated_tokens", "generated_rows", "trained_rows", "micro_steps", "optimizer_steps")
        )
        print(
            f"| {name} | {_fmt(row['final_accuracy'], '.3f')} | {_fmt(row['time_to_target'], '.0f')} "
            f"| {_fmt(row['ratio_to_trl'])} | {median} | {work} | {row['generation_share']:.2f} |"
        )
    print(
        "\nHeld-out accuracy at each evaluation point, mean over seeds (all-correct / all-wrong group shares since"
    )
    print("the previous point in brackets):")
    for name, seeds in results.items():
        columns = [curve(seeds, key) for key in ("time", "accuracy", "all_correct", "all_wrong")]
        cells = [f"{t:.0f}s {a:.3f} ({c:.2f}/{w:.2f})" for t, a, c, w in zip(*columns, strict=True)]
        print(f"- {name}: " + ", ".join(cells))


def curve(seeds: list[list[dict]], key: str) -> list[float]:
    """Per evaluation point, the mean over seeds of `key` (for "accuracy": the overall accuracy)."""
    value = (lambda p: p["accuracy"]["all"]) if key == "accuracy" else (lambda p: p[key])
    return [statistics.fmean(value(runs[i]) for runs in seeds) for i in range(len(seeds[0]))]


def plot(results: dict, summary: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, seeds in results.items():
        ax.plot(curve(seeds, "time"), curve(seeds, "accuracy"), marker=".", label=name)
    ax.axhline(summary["target"], color="grey", linestyle="--", linewidth=1, label="target (TRL final)")
    ax.set_xlabel("training CPU seconds, one core (evaluations excluded)")
    ax.set_ylabel("held-out accuracy (2,000 problems)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def measure(cli) -> tuple[str, list[int], dict]:
    """Run every configuration for every seed, interleaved; return (header, seeds, {name: [points per seed]})."""
    os.sched_setaffinity(0, {cli.core})
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    preset, _ = recipe_settings(PRESET)
    base, _ = recipe_settings(RECIPE)
    configs = {**CONFIGS, "chain-fast": {k: v for k, v in preset.items() if base.get(k) != v}}
    names = cli.configs.split(",")
    unknown = set(names) - set(configs)
    if unknown:
        raise SystemExit(f"--configs: unknown {sorted(unknown)}; choose from {list(configs)}")
    results = {name: [] for name in names}
    seeds = [int(s) for s in cli.seed_list.split(",")] if cli.seed_list else list(range(cli.seeds))
    for seed in seeds:
        order = names[seed % len(names) :] + names[: seed % len(names)]
        for name in order:
            results[name].append(run(name, seed, cli.budget, cli.points, configs[name], cli.per_level))
            last = results[name][-1][-1]
            print(
                f"# seed {seed} {name}: {last['time']:.0f} s, accuracy {results[name][-1][0]['accuracy']['all']:.3f}"
                f" -> {last['accuracy']['all']:.3f}, {last['generated_tokens']} tokens, {last['optimizer_steps']} steps",
                flush=True,
            )
    header = (
        f"chain task, LoRA ({RECIPE}), {cli.budget:.0f} CPU s per run on one core, {cli.points} evaluations of "
        f"{cli.per_level * len(chain.LEVELS)} held-out problems, seeds {seeds}; preset = {configs['chain-fast']}"
    )
    return header, seeds, results


def merge(paths: list[str]) -> tuple[str, list[int], dict]:
    """(header, results) of several --json files of the same settings: their seeds side by side; a later file's
    runs of a (configuration, seed) replace an earlier file's (e.g. a configuration re-run after a fix)."""
    by_seed: dict[str, dict[int, list]] = {}
    headers = []
    for path in paths:
        part = json.loads(Path(path).read_text())
        headers.append(part["header"])
        for name, runs in part["points"].items():
            by_seed.setdefault(name, {}).update(zip(part["seeds"], runs, strict=True))
    results = {name: [runs[seed] for seed in sorted(runs)] for name, runs in by_seed.items()}
    return " + ".join(headers), sorted(by_seed["trl"]) if "trl" in by_seed else [], results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed-list", default=None, help="comma-separated seeds (instead of 0..seeds-1)")
    parser.add_argument("--merge", nargs="+", default=None, help="report on the --json files of earlier runs")
    parser.add_argument("--budget", type=float, default=300.0, help="training CPU seconds per run")
    parser.add_argument("--points", type=int, default=6, help="evaluations after the start, evenly spaced")
    parser.add_argument("--configs", default=",".join([*CONFIGS, "chain-fast"]), help="comma-separated names")
    parser.add_argument("--core", type=int, default=0, help="the CPU core the process is pinned to")
    parser.add_argument("--plot", default=None, help="write the PNG plot here")
    parser.add_argument("--json", default=None, help="write every evaluation point and the summary here")
    parser.add_argument(
        "--per-level", type=int, default=chain.HELDOUT_PER_LEVEL, help="held-out problems per level evaluated"
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, trl and chain-fast, 10 s, 2 points")
    cli = parser.parse_args()
    if cli.quick:
        cli.seeds, cli.budget, cli.points, cli.configs, cli.per_level = 1, 10.0, 2, "trl,chain-fast", 25
    if cli.merge:
        header, seeds, results = merge(cli.merge)
    else:
        header, seeds, results = measure(cli)
        if cli.json:  # every point, before the report (which needs plain TRL's runs)
            Path(cli.json).write_text(
                json.dumps({"header": header, "seeds": seeds, "points": results}, indent=1)
            )
    if "trl" not in results:
        raise SystemExit(
            "no plain TRL runs to compare with: add trl to --configs, or --merge a file that has them"
        )
    summary = summarize(results)
    print_report(results, summary, header)
    if cli.merge and cli.json:
        merged = {"header": header, "seeds": seeds, "summary": summary, "points": results}
        Path(cli.json).write_text(json.dumps(merged, indent=1))
    if cli.plot:
        seeds_run = len(results["trl"])
        plot(
            results, summary, cli.plot, f"time to accuracy on the chain task, LoRA, mean of {seeds_run} seeds"
        )
        print(f"plot: {cli.plot}")


if __name__ == "__main__":
    main()
