"""Time to accuracy on the chain task: how soon does each configuration reach plain TRL's held-out accuracy?

Every configuration trains the shipped chain model (`grpo_hub.tasks.chain_model`) with the settings of
`recipes/configs/chain.yaml` (its learning-rate schedule included: it must not depend on max_steps) for the same
budget on two clocks: process CPU seconds (one core, one torch thread; evaluations off the clock) and the GPU
clock modeled from the counted work (`benchmarks.accuracy.clocks`, calibrated on plain TRL, which runs first
in each seed). A run stops once both clocks have passed the budget. Prompts cycle through the recipe's
training set epoch after epoch, so a configuration that skips prompts moves on to others instead of running
out. Held-out accuracy (greedy, 2,000 problems, standard error <= 1.1 points) is evaluated at `--points`
evenly spaced fractions of the budget on either clock. Runs are interleaved: seed-major, plain TRL first, the
others' order rotated per seed.

Targets: plain TRL's mean accuracy at 50 %, 75 % and 100 % of its budget. Reached: the smoothing rule of
`benchmarks.accuracy.clocks.reached_at`. Ratio: a configuration's time to a target / plain TRL's, per seed
and clock.

    python -m benchmarks.accuracy.time_to_accuracy [--seeds 3] [--budget 300] [--points 12] \\
        [--plot docs/time-to-accuracy.png]
    python -m benchmarks.accuracy.time_to_accuracy --quick   # smoke run: 1 seed, 2 configurations, 8 s (noise)

On the 2-core VM the seeds can run as two such processes, one per core (`--seed-list 0,2 --core 0 --json a.json`,
`--seed-list 1 --core 1 --json b.json`), then `--merge a.json b.json --plot ...` prints the joint report.

`--device cuda` trains on the GPU (fp32, as on the CPU) and measures GPU wall time instead of CPU time (synchronized,
evaluations and generation timed the same way): the report's measured clock is then the GPU's, and its modeled clock
is the model's prediction for the same runs' counted work, to check the model against. No GPU-clock stop rule is
needed there, so one process may run any configuration alone (`--configs preset --seed-list 1 --json c.json`).
"""

import argparse
import os
import tempfile
import time
from collections.abc import Callable

import torch
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig

from benchmarks import chain_testbed as testbed
from benchmarks.accuracy import clocks
from benchmarks.accuracy import tta_harness as harness
from benchmarks.accuracy.accuracy_summary import (
    calibration,
    plot,
    print_clock_check,
    print_report,
    print_sensitivity,
    summarize,
)
from benchmarks.common import DEVICES, QUIET_CPU_RUN, check_device, count_trained_rows
from grpo_hub import GRPOHubConfig
from grpo_hub.algos.advantages import ALL_MAX, ALL_MIN, zero_signal_kinds
from grpo_hub.tasks import chain
from grpo_hub.tasks.chain_model import build_recipe, chain_model_path
from grpo_hub.tasks.model_cache import fingerprint

RECIPE = "recipes/configs/chain-full.yaml"
PRESET = "recipes/configs/chain-full-fast.yaml"
CONFIGS = {
    "trl": None,
    "filter": {"filter_zero_signal": True},  # kept rows packed into fewer micro-steps (the default)
    # the same with TRL's loss denominator: TRL's gradient exactly, each step cheaper (docs/filtering.md)
    "filter-all": {"filter_zero_signal": True, "zero_signal_normalizer": "all"},
    "dynamic": {"dynamic_sampling": True},
    "selective": {"selective_rollout": True},
    "selective+dynamic": {"selective_rollout": True, "dynamic_sampling": True},
    # skipped prompts not replaced: fewer rows generated per step (GRESO's rollout saving)
    "selective-shrink": {"selective_rollout": True, "selective_rollout_mode": "shrink"},
    # the ablation of the bounded revisit: GRESO's probabilistic rule alone
    "selective-unbounded": {"selective_rollout": True, "selective_rollout_revisit_after": None},
    "selective-unbounded+dynamic": {
        "selective_rollout": True,
        "selective_rollout_revisit_after": None,
        "dynamic_sampling": True,
    },
    # per-prompt rollout budgets at TRL's completions per step (docs/rollout-budget.md), the level as prior
    "knapsack": {"rollout_budget": "knapsack", "rollout_budget_column": "level"},
    # the same with the preset's padding-free forwards: the preset's other half, budgets in place of selective rollout
    "knapsack+padding-free": {
        "rollout_budget": "knapsack",
        "rollout_budget_column": "level",
        "padding_free": True,
    },
}  # + "preset": the recommended preset, read from its YAML (PRESET)
STEP_FREE_SCHEDULES = ("constant", "constant_with_warmup")  # schedules a time budget leaves unchanged


class Meter(TrainerCallback):
    """Training clocks, held-out accuracy at fixed points of the budget, work counters.

    Clocks: `clock` seconds (process CPU seconds, or synchronized GPU wall seconds; evaluations excluded) and, given
    `costs`, the modeled GPU clock (`benchmarks.accuracy.clocks`). An evaluation runs at the first optimizer
    step past each of `points` evenly spaced fractions of `budget` on either clock; training stops once both
    clocks have passed the budget. `points`: one dict per evaluation: time (CPU s), wall, accuracy (per
    level), generated tokens / rows, trained rows, micro-steps, optimizer steps, and the shares of all-correct
    / all-wrong groups generated since the last evaluation.
    """

    def __init__(
        self,
        tokenizer,
        budget: float,
        points: int,
        group_size: int,
        per_level: int,
        costs=None,
        clock: Callable[[], float] = time.process_time,
    ):
        self.tokenizer, self.per_level, self.costs = tokenizer, per_level, costs
        self.group_sizes = lambda: group_size  # the trainer's own under rollout_budget (attach)
        self.clock = clock
        grid = [budget * (i + 1) / points for i in range(points)]
        self.grids = {"cpu": list(grid), "gpu": list(grid) if costs else []}
        self.points, self.gen_seconds = [], 0.0
        self.tokens = self.rows = self.trained_rows = self.micro_steps = 0
        self.groups = {"all_correct": 0, "all_wrong": 0, "total": 0}
        self._paused, self._start, self._wall_start = 0.0, 0.0, 0.0

    def attach(self, trainer) -> None:
        """Count the trainer's training forwards and time its generation; receive its callbacks."""

        def count_micro_step(rows: int) -> None:
            self.micro_steps += 1
            self.trained_rows += rows

        count_trained_rows(trainer, count_micro_step)
        generate = trainer._generate

        def timed_generate(*args, **kwargs):
            start = self.clock()
            out = generate(*args, **kwargs)
            self.gen_seconds += self.clock() - start
            return out

        trainer._generate = timed_generate
        budgets = getattr(trainer, "_budgets", None)  # rollout_budget: each group its own size
        if budgets is not None:
            self.group_sizes = lambda: budgets.sizes
        trainer.add_callback(self)

    def reward(self, prompts, completions, answer, completion_ids, **kwargs):
        """`chain_correctness_reward`, counting generated rows / tokens and all-correct / all-wrong groups."""
        rewards = chain.chain_correctness_reward(prompts, completions, answer)
        self.rows += len(completions)
        self.tokens += sum(len(ids) for ids in completion_ids)
        kinds = zero_signal_kinds(torch.tensor(rewards), self.group_sizes(), eps=0.0, low=0.0, high=1.0)
        self.groups["total"] += kinds.numel()
        self.groups["all_correct"] += int((kinds == ALL_MAX).sum())
        self.groups["all_wrong"] += int((kinds == ALL_MIN).sum())
        return rewards

    def elapsed(self) -> float:
        return self.clock() - self._start - self._paused

    def _evaluate(self, model, step: int) -> None:
        paused_at, elapsed = self.clock(), self.elapsed()
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
        self._paused += self.clock() - paused_at

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._start, self._wall_start = self.clock(), time.perf_counter()
        self._evaluate(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        now = {"cpu": self.elapsed()}
        if self.costs:
            now["gpu"] = self.costs.seconds(self.rows, self.micro_steps)
        crossed = False
        for clock, grid in self.grids.items():
            while grid and now[clock] >= grid[0]:
                grid.pop(0)
                crossed = True
        if crossed:
            self._evaluate(model, state.global_step)
            control.should_training_stop = not any(self.grids.values())


def check_schedule(fields: dict) -> None:
    """The benchmark stops on a time budget, so the recipe's learning-rate schedule must not depend on max_steps
    (else the benchmark would train with another schedule than the recipe it measures)."""
    schedule = fields.get("lr_scheduler_type", "linear")
    if schedule not in STEP_FREE_SCHEDULES:
        raise SystemExit(
            f"lr_scheduler_type: {schedule} in the recipe depends on max_steps, which a time budget does not fix; "
            f"use one of {STEP_FREE_SCHEDULES} in the YAML"
        )


def synchronized_wall_clock() -> float:
    """GPU wall seconds: CUDA kernels run asynchronously, so wait for the queued ones first."""
    torch.cuda.synchronize()
    return time.perf_counter()


def run(
    name: str,
    seed: int,
    budget: float,
    points: int,
    extra: dict | None,
    per_level: int,
    costs=None,
    device: str = "cpu",
) -> list[dict]:
    """Train configuration `name` for `budget` seconds on the measured clock (CPU time, or GPU wall time with
    `device="cuda"`) and on the modeled GPU clock of `costs`, if given; return its evaluation points."""
    fields, lora = testbed.recipe_settings(RECIPE)
    check_schedule(fields)
    prompts = fields.pop("num_prompts")
    model_dir = chain_model_path()
    common = {
        **fields,
        "output_dir": tempfile.mkdtemp(),
        **QUIET_CPU_RUN,
        "use_cpu": device == "cpu",  # fp32 on either device: the testbed's arithmetic
        "max_steps": 100_000,  # the budget stops training (the schedule does not depend on it: check_schedule)
        "seed": seed,
    }
    args = training_args(common, extra)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    clock = time.process_time if device == "cpu" else synchronized_wall_clock
    meter = Meter(tokenizer, budget, points, args.num_generations, per_level, costs, clock)
    testbed.chain_trainer(args, meter, lora, prompts, seed).train()
    return meter.points


def training_args(common: dict, extra: dict | None) -> GRPOConfig:
    """Plain TRL's config of the testbed's fields `common` (`extra` None), or grpo_hub's with `extra` over them (a
    configuration may change a testbed field, e.g. the preset's padding_free)."""
    return GRPOConfig(**testbed.plain_trl(common)) if extra is None else GRPOHubConfig(**{**common, **extra})


def configurations() -> dict[str, dict | None]:
    """CONFIGS and "preset": the recommended preset's fields that differ from the testbed's."""
    preset, _ = testbed.recipe_settings(PRESET)
    base, _ = testbed.recipe_settings(RECIPE)
    return {**CONFIGS, "preset": {k: v for k, v in preset.items() if base.get(k) != v}}


def measure(cli) -> tuple[dict, dict]:
    """Run every configuration for every seed, interleaved; return (run record, {name: [points per seed]})."""
    os.sched_setaffinity(0, {cli.core})
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    configs = configurations()
    names = cli.configs.split(",")
    unknown = set(names) - set(configs)
    if unknown:
        raise SystemExit(f"--configs: unknown {sorted(unknown)}; choose from {list(configs)}")
    if "trl" not in names and cli.device == "cpu":
        raise SystemExit(
            "--configs must include trl: every ratio is to plain TRL, whose runs calibrate the GPU clock"
        )
    results = {name: [] for name in names}
    seeds = [int(s) for s in cli.seed_list.split(",")] if cli.seed_list else list(range(cli.seeds))
    # plain TRL first in each seed: its run calibrates the seed's GPU clock, which the others' evaluations and stop
    # follow
    for seed, name in harness.run_order(seeds, names):
        stop_on_model = name != "trl" and cli.device == "cpu"  # on a GPU the measured clock is the GPU's
        costs = calibration([results["trl"][-1]], clocks.GPU_GENERATION_SHARE) if stop_on_model else None
        results[name].append(
            run(name, seed, cli.budget, cli.points, configs[name], cli.per_level, costs, cli.device)
        )
        last = results[name][-1][-1]
        print(
            f"# seed {seed} {name}: {last['time']:.0f} s, accuracy {results[name][-1][0]['accuracy']['all']:.3f}"
            f" -> {last['accuracy']['all']:.3f}, {last['generated_tokens']} tokens, {last['optimizer_steps']} steps",
            flush=True,
        )
    return run_record(
        cli.budget, cli.points, cli.per_level, seeds, {name: configs[name] for name in names}, cli.device
    ), results


def device_name(device: str) -> str:
    """The measured clock's device, as the run record names it: "cpu", or the GPU's name."""
    return "cpu" if device == "cpu" else torch.cuda.get_device_name()


def run_record(
    budget: float, points: int, per_level: int, seeds: list[int], configs: dict, device: str = "cpu"
) -> dict:
    """What a stored run holds, named once: the testbed (recipe and its settings, the chain model's build fingerprint,
    the measured clock's device, budget, evaluations), the seeds, and every configuration it ran with its settings
    over the recipe's (plain TRL: none; 'preset': read from PRESET)."""
    base, _ = testbed.recipe_settings(RECIPE)
    return {
        "recipe": RECIPE,
        "device": device_name(device),
        "model_build": fingerprint(build_recipe()),
        "recipe_settings": base,
        "budget": budget,
        "points": points,
        "heldout_problems": per_level * len(chain.LEVELS),
        "seeds": seeds,
        "configs": {name: settings or {} for name, settings in configs.items()},
        **({"preset_file": PRESET} if "preset" in configs else {}),
    }


def describe(record: dict) -> str:
    """The report's first line: what was run."""
    configs = "; ".join(f"{name} {settings or '(plain TRL)'}" for name, settings in record["configs"].items())
    where = (
        "on one core (on both clocks)"
        if measured_on(record) == "cpu"
        else f"of {record['device']} wall time (and on the modeled clock)"
    )
    return (
        f"chain task ({record['recipe']}), {record['budget']:.0f} s per run {where}, "
        f"{record['points']} evaluations of {record['heldout_problems']} held-out problems, seeds {record['seeds']}; "
        f"configurations: {configs}"
        + (f" (preset: {record['preset_file']})" if "preset_file" in record else "")
    )


def measured_on(record: dict) -> str:
    """The measured clock's device of a run record: "cpu" (records written before the key existed) or a GPU's name."""
    return record.get("device", "cpu")


def measured_clock(record: dict) -> str:
    """The report's name for the measured clock of a run record."""
    return "CPU" if measured_on(record) == "cpu" else f"GPU wall ({record['device']})"


def merge(paths: list[str]) -> tuple[dict, dict]:
    """(run record, results) of several --json files of the same testbed: their seeds side by side; a later file's runs
    of a (configuration, seed) replace an earlier file's (e.g. a configuration re-run after a fix). Files of another
    testbed, or with another configuration under the same name, are refused in one line."""
    by_seed: dict[str, dict[int, list]] = {}
    record = None
    for path in paths:
        part = harness.read_stored(path)
        if "run" not in part:
            raise SystemExit(
                f"--merge: {path} has no run record (written by an older benchmark). Fix: re-run it."
            )
        this = {**part["run"], "device": measured_on(part["run"])}
        if record is None:
            record, first = {"configs": {}}, path
        for key, value in this.items():  # the testbed; 'preset_file' only in the files that ran the preset
            if key not in ("seeds", "configs") and record.setdefault(key, value) != value:
                raise SystemExit(
                    f"--merge: {path} has {key} {value!r}, {first} {record[key]!r}: merge runs of one testbed"
                )
        for name, settings in this["configs"].items():
            if record["configs"].setdefault(name, settings) != settings:
                raise SystemExit(
                    f"--merge: configuration {name!r} is {settings} in {path}, {record['configs'][name]} in an earlier "
                    "file. Fix: rename one of them, or re-run it."
                )
        for name, runs in part["points"].items():
            by_seed.setdefault(name, {}).update(zip(this["seeds"], runs, strict=True))
    results = {name: [runs[seed] for seed in sorted(runs)] for name, runs in by_seed.items()}
    record["seeds"] = sorted({seed for runs in by_seed.values() for seed in runs})
    return record, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_arguments(parser, points=12)
    parser.add_argument("--seed-list", default=None, help="comma-separated seeds (instead of 0..seeds-1)")
    parser.add_argument("--merge", nargs="+", default=None, help="report on the --json files of earlier runs")
    parser.add_argument(
        "--budget", type=float, default=300.0, help="training seconds per run, on both clocks"
    )
    parser.add_argument("--configs", default=",".join([*CONFIGS, "preset"]), help="comma-separated names")
    parser.add_argument("--core", type=int, default=0, help="the CPU core the process is pinned to")
    parser.add_argument("--plot", default=None, help="write the PNG plot here")
    parser.add_argument("--quick", action="store_true", help="1 seed, trl and the preset, 8 s, 4 points")
    parser.add_argument(
        "--device", choices=DEVICES, default="cpu", help="cuda: train on the GPU, measure its wall time"
    )
    cli = parser.parse_args()
    check_device(cli.device)
    if cli.quick:
        cli.seeds, cli.budget, cli.points, cli.configs, cli.per_level = 1, 8.0, 4, "trl,preset", 10
    harness.check_points(cli.points)
    if cli.merge:
        record, results = merge(cli.merge)
    else:
        record, results = measure(cli)
        if cli.json:  # every point, before the report
            harness.store(cli.json, {"run": record, "points": results})
        if "trl" not in results:  # a GPU process that ran other configurations only
            print(
                f"no plain TRL run here: report with --merge {cli.json or '<--json files>'} and plain TRL's files"
            )
            return
    if "trl" not in results:
        raise SystemExit("no plain TRL runs to compare with: --merge a file that has them")
    budget = record["budget"]
    summary = summarize(results, budget)
    print_report(results, summary, describe(record), measured_clock(record))
    print_sensitivity(results, budget)
    if measured_on(record) != "cpu":
        print_clock_check(results, budget, record["seeds"])
    if cli.merge and cli.json:
        harness.store(cli.json, {"run": record, "summary": summary, "points": results})
    if cli.plot:
        seeds_run = len(results["trl"])
        plot(
            results,
            summary,
            cli.plot,
            f"time to accuracy on the chain task ({RECIPE}), every run of {seeds_run} seeds",
            "training CPU seconds, one core"
            if measured_on(record) == "cpu"
            else f"training {measured_clock(record)} s",
        )
        print(f"plot: {cli.plot}")


if __name__ == "__main__":
    main()
