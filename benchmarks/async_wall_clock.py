"""Wall-clock time to accuracy with generation on its own engine: plain TRL against a local vLLM server, synchronous
and asynchronous, on this 2-core machine.

Configurations (the LoRA main job, `recipes/configs/chain.yaml`: its 200 steps and linear schedule; same seed per seed
index; seed-major, plain TRL first, the others' order rotated per seed):
  trl           plain `trl.GRPOTrainer`, HF generate, both cores (2 torch threads, not pinned);
  server-sync   `GRPOHubTrainer`, vllm_mode="server", vllm_server_sync="merged", max_staleness=0: TRL's loop, the
                server pinned to core 1 (started once, reused by every run), the trainer on core 0 (1 thread);
  server-async  the same with max_staleness=1: the server generates the next batch while the trainer trains;
  server-async+filter  and zero-signal filtering (packed), which shrinks the trainer's part of the step;
  ... (scoring forward)  the two asynchronous runs with TRL's no-grad scoring forward for the IS ratio, which
                grpo_hub otherwise takes from the training forward (docs/vllm.md).
Both server configurations correct with vllm_importance_sampling_mode="token_truncate" (the preset
`chain-server.yaml`'s); plain TRL keeps its defaults.

Budget: plain TRL's wall seconds for the job's 200 steps (per seed), or `--budget` seconds. A run stops at the budget
or at its last step, whichever comes first. Held-out accuracy (greedy, 2,000 problems), OFF the clock, at `--points`
evenly spaced optimizer steps, the same for every configuration, so accuracy per step compares without interpolating
between evaluations (a run stopped by the budget is evaluated there too); with `--budget`, `--equal-time` or
`--time-budget` at evenly spaced fractions of the budget instead. Equal time (each configuration but plain TRL trains
for the seed's budget on a schedule of its own length): `--equal-time STEPS_JSON` sets that length before the run
from stored step times; `--time-budget` lets `time_budget_seconds` plan it from the run's own pace (evaluations off
its clock; docs/time-budget.md). Before an evaluation pauses the clock, it waits for the batch in flight (the
next step's weight sync would wait for it too). Targets: plain TRL's mean accuracy at 50,
75 and 100 % of its budget (100 % = its final accuracy); reached: `benchmarks.clocks.reached_at`; ratio: a run's time
over the time plain TRL's mean curve takes (docs/time-to-accuracy.md).

Two-device model: per run, generation G (the engine's seconds per step), training T (the trainer's step time minus
its waits for generation and the sync) and sync S per step. With G rescaled so that G / (G + T) = `--gpu-share`, a
synchronous step costs G + T + S and an asynchronous one max(G, T) + S: overlap buys at most 1 / max(share, 1 - share).

    python -m benchmarks.async_wall_clock [--seeds 3] [--points 8] [--budget S] [--json out.json]
    python -m benchmarks.async_wall_clock --seeds 3 --resume out.json --json out.json   # finish a cut-short one
    python -m benchmarks.async_wall_clock --seeds 3 --time-budget --configs trl,server-async+filter   # equal time
    python -m benchmarks.async_wall_clock --quick     # smoke run: 1 seed, 15 s, 2 points, 200 problems (noise)
"""

import argparse
import contextlib
import itertools
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig

from benchmarks import clocks
from benchmarks.accuracy_summary import mean_curve
from benchmarks.common import QUIET_CPU_RUN, count_trained_rows, print_table
from benchmarks.time_to_accuracy import chain_trainer, plain_trl, recipe_settings
from grpo_hub import GRPOHubConfig
from grpo_hub.generation import server_process
from grpo_hub.tasks import chain
from grpo_hub.tasks.chain_model import chain_model_path

RECIPE = "recipes/configs/chain.yaml"
# name -> grpo_hub settings on top of SERVER_FIELDS (None: plain TRL)
CONFIGS = {
    "trl": None,
    "server-sync": {"max_staleness": 0},
    "server-async": {"max_staleness": 1},
    # overlap alone leaves the trainer's core the bottleneck: zero-signal filtering shrinks its work
    "server-async+filter": {"max_staleness": 1, "filter_zero_signal": True},
    "server-async (scoring forward)": {"max_staleness": 1},
    "server-async+filter (scoring forward)": {"max_staleness": 1, "filter_zero_signal": True},
    # staleness, filtering and filtering's normaliser apart: filtering without staleness; async + filtering with
    # the unfiltered batch's denominator (TRL's gradient exactly) instead of the kept rows' (DAPO)
    "server-sync+filter": {"max_staleness": 0, "filter_zero_signal": True},
    "server-async+filter (normaliser all)": {
        "max_staleness": 1,
        "filter_zero_signal": True,
        "zero_signal_normalizer": "all",
    },
}
SCORING_FORWARD = " (scoring forward)"  # the suffix of the configurations that keep TRL's scoring forward
SERVER_FIELDS = {
    "use_vllm": True,
    "vllm_mode": "server",
    "vllm_server_sync": "merged",
    "vllm_importance_sampling_mode": "token_truncate",
}
SERVER_CORE, TRAINER_CORE = 1, 0
# --gpu-share default: plain TRL's generation share of a GPU step (H100, ../shared/DESIGN.md)
GPU_SHARE = clocks.GPU_GENERATION_SHARE
STEP_MARKS = (50, 100, 150, 200)  # optimizer steps at which the report compares accuracy per step
# --time-budget: the schedule of those runs, and their upper bound (the setting plans fewer steps)
TIME_BUDGET, TIME_BUDGET_CAP = "time budget", 1000
# per-step logged diagnostics a run stores: name -> the trainer's metric (a tuple: the first one logged)
DIAGNOSTICS = {
    "staleness": ("async/staleness",),
    "is_weight_mean": ("sampling/importance_sampling_ratio/mean",),
    "is_share_outside": ("vllm_is/frac_truncated", "vllm_is/frac_masked"),
    "is_ess": ("vllm_is/ess",),
    "is_kl_k3": ("vllm_is/kl_k3",),
}


def pin(cores: set[int]) -> None:
    """Every thread of this process onto `cores`, one torch thread per core (new threads inherit the affinity)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cores)
    torch.set_num_threads(len(cores))


class Timers:
    """Wall seconds spent in wrapped calls of the training thread, by name; a wrapped call inside another one counts
    under its own name only (e.g. TRL's weight sync inside `_generate`)."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self._nested = []

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            self._nested.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                spent, inner = time.perf_counter() - start, self._nested.pop()
                self.seconds[name] += spent - inner
                if self._nested:
                    self._nested[-1] += spent

        return timed


class Meter(TrainerCallback):
    """The training wall clock (evaluations off it), held-out accuracy at `marks`, the work and the time split.

    `marks`: evenly spaced optimizer steps (`unit` "steps": plain TRL's run that sets the budget) or wall seconds;
    an evaluation runs at the first step end past each mark and at the last step, training stops past the last mark.
    Time split (Timers): "generate" (`_generate`: HF generate, or the server's answer in TRL's loop), "wait" (the
    asynchronous rollouts' pop and the sync's wait for running requests), "sync" (the weight sync itself);
    "engine": the server's seconds per asynchronous request (its own thread). The logged `async/wait_seconds` times
    the pop only: with the merged sync the trainer mostly waits inside the sync, for the batch in flight.
    """

    def __init__(
        self, tokenizer, marks: list[float], unit: str, per_level: int, deadline: float | None = None
    ):
        self.tokenizer, self.marks, self.unit, self.per_level = tokenizer, marks, unit, per_level
        # wall seconds (marks in steps): evaluate and stop at the first step end past it
        self.deadline = deadline
        self.timers, self.engine_seconds = Timers(), 0.0
        self.points, self.staleness, self.logged_wait, self.diagnostics = [], [], [], []
        self.tokens = self.trained_rows = 0
        self.trainer, self._start, self._paused = None, 0.0, 0.0

    def attach(self, trainer) -> None:
        """Count the trainer's generated tokens (`reward`) and trained rows, time its parts, receive its callbacks."""

        def count_rows(rows: int) -> None:
            self.trained_rows += rows

        count_trained_rows(trainer, count_rows)
        trainer._generate = self.timers.wrap("generate", trainer._generate)
        forward = trainer._get_per_token_logps_and_entropies
        scoring = self.timers.wrap(
            "scoring", forward
        )  # no-grad policy forwards: TRL's scoring (and reference) one
        trainer._get_per_token_logps_and_entropies = lambda *a, **k: (
            forward(*a, **k) if torch.is_grad_enabled() else scoring(*a, **k)
        )
        generation = getattr(trainer, "vllm_generation", None)
        if generation is not None:
            generation.sync_weights = self.timers.wrap("sync", generation.sync_weights)
            sync = generation.grpo_hub_sync
            sync.wait_idle = self.timers.wrap("wait", sync.wait_idle)
        rollouts = getattr(trainer, "_rollouts", None)
        if rollouts is not None:
            rollouts.pop = self.timers.wrap("wait", rollouts.pop)
            rollouts.client.generate = self._engine_timed(rollouts.client.generate)
        self.trainer = trainer
        trainer.add_callback(self)

    def _engine_timed(self, generate):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = generate(*args, **kwargs)
            self.engine_seconds += time.perf_counter() - start
            return out

        return timed

    def reward(self, prompts, completions, answer, completion_ids, **kwargs):
        """`chain_correctness_reward`, counting the generated tokens it scores."""
        self.tokens += sum(len(ids) for ids in completion_ids)
        return chain.chain_correctness_reward(prompts, completions, answer)

    def clock(self) -> float:
        """Wall seconds with the evaluations taken out (a run's time budget reads this clock)."""
        return time.perf_counter() - self._paused

    def elapsed(self) -> float:
        return self.clock() - self._start

    def _evaluate(self, model, step: int) -> None:
        rollouts = getattr(self.trainer, "_rollouts", None)
        if (
            rollouts is not None
        ):  # on the clock: the next step's sync would wait for the batch in flight anyway
            self.timers.wrap("wait", rollouts.wait_idle)()
        paused_at, elapsed = time.perf_counter(), self.elapsed()
        rng = torch.get_rng_state()  # the evaluation must not change the training's random stream
        accuracy = chain.evaluate(model, self.tokenizer, n=self.per_level)["greedy"]
        torch.set_rng_state(rng)
        model.train()
        self.points.append(
            {
                "time": round(elapsed, 2),
                "accuracy": accuracy,
                "optimizer_steps": step,
                "generated_tokens": self.tokens,
                "trained_rows": self.trained_rows,
            }
        )
        self._paused += time.perf_counter() - paused_at

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._start = time.perf_counter()
        self._evaluate(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        now = state.global_step if self.unit == "steps" else self.elapsed()
        crossed = bool(self.marks) and now >= self.marks[0]
        while self.marks and now >= self.marks[0]:
            self.marks.pop(0)
        late = self.deadline is not None and self.elapsed() >= self.deadline
        if crossed or late or state.global_step >= state.max_steps:
            self._evaluate(model, state.global_step)
        # the trainer's own stop (max_steps) stands; the meter only adds its own, past the last mark or the deadline
        control.should_training_stop = control.should_training_stop or not self.marks or late

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "async/staleness" in logs:
            self.staleness.append(logs["async/staleness"])
            self.logged_wait.append(logs["async/wait_seconds"])
        found = {}
        for name, keys in DIAGNOSTICS.items():
            key = next((k for k in keys if k in logs), None)
            if key is not None:
                found[name] = logs[key]
        if found:
            self.diagnostics.append({"step": state.global_step, **found})

    def record(self, name: str, seed: int, budget: float | None, schedule: str) -> dict:
        """The run: its evaluation points, budget, schedule ("steps": the recipe's 200; "time": its own length, set
        for the budget from stored step times; TIME_BUDGET: planned by time_budget_seconds), work, per-step diagnostics, and seconds per optimizer step of each part."""
        seconds, last = self.timers.seconds, self.points[-1]
        steps, wall = max(last["optimizer_steps"], 1), last["time"]
        blocked = seconds["generate"] + seconds["wait"]  # the trainer idle, waiting for generation
        engine = self.engine_seconds if name.startswith("server-async") else seconds["generate"]
        generation = getattr(self.trainer, "vllm_generation", None)
        sync = getattr(generation, "grpo_hub_sync", None)
        return {
            "config": name,
            "seed": seed,
            "schedule": schedule,
            "max_steps": self.trainer.args.max_steps,
            "planned_steps": self.trainer.state.max_steps,  # with time_budget_seconds: its last plan
            "evaluated_at": self.unit,  # "steps" or "seconds": where the evaluations sit
            "budget": wall if budget is None else budget,
            "points": self.points,
            "wall": wall,
            "optimizer_steps": last["optimizer_steps"],
            "generated_tokens": last["generated_tokens"],
            "trained_rows": last["trained_rows"],
            "mean_staleness": statistics.fmean(self.staleness) if self.staleness else 0.0,
            "mean_logged_wait": statistics.fmean(self.logged_wait) if self.logged_wait else None,
            "syncs": sync.syncs if sync else 0,
            "bytes_per_sync": sync.bytes_last_sync if sync else 0,
            "diagnostics": self.diagnostics,
            "per_step": {
                "generation": engine / steps,
                "blocked": blocked / steps,
                "sync": seconds["sync"] / steps,
                "scoring": seconds["scoring"] / steps,
                "training": (wall - blocked - seconds["sync"] - seconds["scoring"]) / steps,
            },
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_server(port: int, log_dir: str) -> server_process.LocalServer:
    """The chain model's vLLM server on `SERVER_CORE` (fp32, no LoRA: the merged sync, as the recipe starts it); stopped
    on exit, exception, SIGINT and SIGTERM."""
    argv = server_process.server_command(str(chain_model_path()), port=port, dtype="float32", lora_rank=None)
    env = server_process.own_server_env(cores=str(SERVER_CORE), gpus=None)
    log = Path(log_dir, "vllm-server.log")
    return server_process.LocalServer(argv, env, log, timeout=600, cores=str(SERVER_CORE))


def run(
    name: str,
    seed: int,
    budget: float | None,
    points: int,
    per_level: int,
    server_url: str,
    max_steps: int | None = None,
    step_marks: bool = False,
    time_budget: bool = False,
) -> dict:
    """Train configuration `name` until `budget` wall seconds (None: plain TRL's 200 steps) or its last step: the
    recipe's 200, or `max_steps` (its own schedule's length: the learning rate reaches 0 there), or with
    `time_budget` the steps `time_budget_seconds=budget` plans (at most TIME_BUDGET_CAP; evaluations off its clock).
    Evaluations at evenly spaced steps without a budget or with `step_marks`, else at evenly spaced fractions of the
    budget."""
    fields, lora = recipe_settings(RECIPE)
    prompts = fields.pop("num_prompts")
    if max_steps is not None:
        fields["max_steps"] = max_steps
    if time_budget:
        fields |= {"max_steps": TIME_BUDGET_CAP, "time_budget_seconds": budget}
    common = {**fields, "output_dir": tempfile.mkdtemp(), **QUIET_CPU_RUN, "seed": seed}
    settings = CONFIGS[name]
    if settings is None:
        pin({TRAINER_CORE, SERVER_CORE})
        args = GRPOConfig(**plain_trl(common))
    else:
        pin({TRAINER_CORE})
        args = GRPOHubConfig(**common, **SERVER_FIELDS, vllm_server_base_url=server_url, **settings)
    if budget is None or step_marks:
        marks, unit = [args.max_steps * (i + 1) / points for i in range(points)], "steps"
    else:
        marks, unit = [budget * (i + 1) / points for i in range(points)], "seconds"
    model_dir = chain_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    meter = Meter(tokenizer, marks, unit, per_level, deadline=budget if unit == "steps" else None)
    trainer = chain_trainer(args, meter, lora, prompts, seed)
    if name.endswith(SCORING_FORWARD):
        trainer._use_loss_time_is(False)
    if time_budget:
        trainer._time_budget.clock = meter.clock
    trainer.train()
    schedule = TIME_BUDGET if time_budget else "steps" if max_steps is None else "time"
    return meter.record(name, seed, budget, schedule)


def two_device_ratio(generation: float, training: float, sync: float, share: float | None) -> float:
    """Modeled time of an asynchronous step over a synchronous one, max(G, T) + S over G + T + S, with G rescaled to
    T * share / (1 - share) (generation's share of G + T) unless `share` is None (G as measured)."""
    if share is not None:
        generation = training * share / (1 - share)
    return (max(generation, training) + sync) / (generation + training + sync)


def accuracy_at_step(points: list[dict], step: int) -> float | None:
    """Held-out accuracy after `step` optimizer steps, linear between the two evaluations around it (None: the run
    stopped before it). Accuracy per step, whatever the clock: it separates learning less per step from stepping
    more slowly."""
    for before, after in itertools.pairwise(points):
        if before["optimizer_steps"] <= step <= after["optimizer_steps"]:
            a0, a1 = before["accuracy"]["all"], after["accuracy"]["all"]
            span = after["optimizer_steps"] - before["optimizer_steps"]
            return a0 if span == 0 else a0 + (a1 - a0) * (step - before["optimizer_steps"]) / span
    return None


def standard_error(values: list[float]) -> float | None:
    """Standard error of the mean of `values` (None below two values)."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def paired_to_trl(trl: list[dict], runs: list[dict], step: int) -> dict:
    """A configuration's accuracy after `step` optimizer steps minus plain TRL's, paired by seed (the seeds where both
    got there): mean, standard error, n."""
    theirs = {r["seed"]: accuracy_at_step(r["points"], step) for r in trl}
    differences = [
        mine - theirs[r["seed"]]
        for r in runs
        if (mine := accuracy_at_step(r["points"], step)) is not None and theirs.get(r["seed"]) is not None
    ]
    mean = statistics.fmean(differences) if differences else None
    return {"mean": mean, "se": standard_error(differences), "n": len(differences)}


def mean_diagnostics(runs: list[dict]) -> dict:
    """Each logged `DIAGNOSTICS` value's mean over every step of `runs` (the names some step logged)."""
    values = defaultdict(list)
    for r in runs:
        for logged in r.get("diagnostics", []):
            for name in DIAGNOSTICS:
                if name in logged:
                    values[name].append(logged[name])
    return {name: statistics.fmean(v) for name, v in values.items()}


def summarize(runs: list[dict], share: float) -> dict:
    """Targets (plain TRL's mean accuracy at `clocks.TARGET_FRACTIONS` of its budget) and per configuration: time to
    each target per seed, its ratio to plain TRL's mean curve's time, their median, accuracy at TRL's budget, and the
    modeled two-device ratio of each run (at the measured generation share and at `share`), and its accuracy at
    `STEP_MARKS` optimizer steps."""
    by_config = defaultdict(list)
    for r in runs:
        by_config[r["config"]].append(r)
    trl = [r["points"] for r in by_config["trl"]]
    n = len(trl[0]) - 1
    if any(len(points) != n + 1 for points in trl):
        raise SystemExit(
            "plain TRL ended its 200 steps before --budget in some seed: lower --budget or leave it out"
        )
    targets = {
        str(f): statistics.fmean(points[round(f * n)]["accuracy"]["all"] for points in trl)
        for f in clocks.TARGET_FRACTIONS
    }
    trl_curve = mean_curve(trl, "cpu", None)  # its "cpu" clock reads each point's `time`: here wall seconds
    table = {}
    for name, rs in by_config.items():
        curves = [([p["time"] for p in r["points"]], [p["accuracy"]["all"] for p in r["points"]]) for r in rs]
        row = {"seeds": [r["seed"] for r in rs], "final_accuracy": [a[-1] for _, a in curves]}
        for fraction, target in targets.items():
            theirs = clocks.reached_at(*trl_curve, target)
            reached = [clocks.reached_at(t, a, target) for t, a in curves]
            ratios = [clocks.time_ratio(mine, theirs) for mine in reached]
            row[fraction] = {
                "time_to_target": reached,
                "trl_time_to_target": theirs,
                "ratio_to_trl": ratios,
                "median_ratio": statistics.median(ratios) if None not in ratios else None,
            }
        row["accuracy_at_budget"] = [
            clocks.accuracy_at(t, a, r["budget"]) for (t, a), r in zip(curves, rs, strict=True)
        ]
        row["accuracy_at_steps"] = {
            str(step): [accuracy_at_step(r["points"], step) for r in rs] for step in STEP_MARKS
        }
        row["standard_error_at_steps"] = {
            step: standard_error([v for v in values if v is not None])
            for step, values in row["accuracy_at_steps"].items()
        }
        row["paired_to_trl_at_steps"] = {
            str(step): paired_to_trl(by_config["trl"], rs, step) for step in STEP_MARKS
        }
        row["diagnostics"] = mean_diagnostics(rs)
        row["modeled"] = [
            {
                "measured_share": s["generation"] / (s["generation"] + s["training"]),
                "at_measured_share": two_device_ratio(s["generation"], s["training"], s["sync"], None),
                "at_share": two_device_ratio(s["generation"], s["training"], s["sync"], share),
            }
            for s in (r["per_step"] for r in rs)
        ]
        table[name] = row
    return {"targets": targets, "gpu_share": share, "configs": table}


def _seconds(values) -> str:
    return " / ".join("never" if v is None else f"{v:.0f}" for v in values)


def _steps(run: dict) -> str:
    """Optimizer steps run, and of how many its schedule planned when it had its own (equal time)."""
    planned = ""
    if run.get("schedule") == "time":
        planned = f" of {run['max_steps']}"
    elif run.get("schedule") == TIME_BUDGET:
        planned = f" of {run['planned_steps']} (by the setting)"
    return f"{run['optimizer_steps']}{planned}"


def _se(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _value(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def _ratios(values) -> str:
    return " / ".join("never" if v is None else f"{v:.2f}" for v in values)


def print_report(runs: list[dict], summary: dict, header: str) -> None:
    print(header)
    targets = ", ".join(f"{float(f):.0%} {t:.4f}" for f, t in summary["targets"].items())
    print(
        f"targets = plain TRL's mean held-out accuracy at a fraction of its budget (100 % = final): {targets}\n"
    )
    print("Wall-clock time to each target: median ratio to plain TRL's mean curve (per seed: ratio; seconds)")
    rows = []
    for name, row in summary["configs"].items():
        cells = []
        for fraction in summary["targets"]:
            cell = row[fraction]
            median = (
                "never (some seed)" if cell["median_ratio"] is None else f"**{cell['median_ratio']:.2f}**"
            )
            cells.append(f"{median} ({_ratios(cell['ratio_to_trl'])}; {_seconds(cell['time_to_target'])} s)")
        accuracy = statistics.fmean(row["accuracy_at_budget"])
        rows.append([name, *cells, f"{accuracy:.3f}", " / ".join(f"{a:.3f}" for a in row["final_accuracy"])])
    heads = [f"to {float(f):.0%}" for f in summary["targets"]]
    print_table(["config", *heads, "accuracy at TRL's budget (mean)", "final (per seed)"], rows)
    print(
        "\nHeld-out accuracy by optimizer step (mean of the seeds that got there; per seed, '-': stopped before)"
    )
    rows = []
    for name, row in summary["configs"].items():
        cells = []
        for values in row["accuracy_at_steps"].values():
            reached = [v for v in values if v is not None]
            mean = f"{statistics.fmean(reached):.3f}" if reached else "-"
            cells.append(f"{mean} ({' / '.join('-' if v is None else f'{v:.3f}' for v in values)})")
        rows.append([name, *cells])
    print_table(["config", *(f"step {step}" for step in STEP_MARKS)], rows)
    print(
        "\nBy optimizer step, paired by seed: mean (± standard error) of the seeds; its difference to plain TRL (± SE)"
    )
    rows = []
    for name, row in summary["configs"].items():
        cells = []
        for step, values in row["accuracy_at_steps"].items():
            reached, se = [v for v in values if v is not None], row["standard_error_at_steps"][step]
            paired = row["paired_to_trl_at_steps"][step]
            mine = f"{statistics.fmean(reached):.3f} ± {_se(se)}" if reached else "-"
            difference = "-" if paired["mean"] is None else f"{paired['mean']:+.3f} ± {_se(paired['se'])}"
            cells.append(f"{mine}; {difference} (n {paired['n']})")
        rows.append([name, *cells])
    print_table(["config", *(f"step {step}" for step in STEP_MARKS)], rows)
    print("\nIS and staleness diagnostics, mean over every logged step of every seed")
    rows = [
        [name, *(_value(row["diagnostics"].get(d)) for d in DIAGNOSTICS)]
        for name, row in summary["configs"].items()
    ]
    print_table(["config", *DIAGNOSTICS], rows)
    print("\nWork and seconds per optimizer step of each run (blocked: the trainer waiting for generation):")
    rows = []
    for r in runs:
        s, wait = r["per_step"], r["mean_logged_wait"]
        rows.append(
            [f"{r['config']} seed {r['seed']}", f"{r['wall']:.0f}", _steps(r), str(r["generated_tokens"]),
             str(r["trained_rows"]), f"{r['mean_staleness']:.2f}", "-" if wait is None else f"{wait:.3f}",
             f"{s['generation']:.3f}", f"{s['training']:.3f}", f"{s.get('scoring', 0.0):.3f}", f"{s['blocked']:.3f}",
             f"{s['sync']:.3f}",
             f"{r['syncs']}", f"{r['bytes_per_sync'] / 1e6:.1f}"]
        )  # fmt: skip
    print_table(
        ["run", "wall s", "steps", "tokens", "trained rows", "staleness", "logged wait s", "generation s",
         "fwd+bwd s", "scoring s", "blocked s", "sync s", "syncs", "MB/sync"],
        rows,
    )  # fmt: skip
    share = summary["gpu_share"]
    print(
        f"\nTwo-device model: asynchronous step / synchronous step = (max(G, T) + S) / (G + T + S), at each run's "
        f"measured G, and with G rescaled to a {share:.0%} generation share (bound without sync: "
        f"{max(share, 1 - share):.2f}, i.e. at most {1 / max(share, 1 - share):.2f}x faster)"
    )
    rows = []
    for name, row in summary["configs"].items():
        for seed, m in zip(row["seeds"], row["modeled"], strict=True):
            rows.append([f"{name} seed {seed}", f"{m['measured_share']:.2f}", f"{m['at_measured_share']:.2f}",
                         f"{m['at_share']:.2f}"])  # fmt: skip
    print_table(["run", "measured share G/(G+T)", "async/sync at it", f"async/sync at {share:.0%}"], rows)


def seconds_per_step(stored: list[dict]) -> dict[str, float]:
    """Each configuration's median wall seconds per optimizer step over the equal-steps runs in `stored` (every seed
    of a `--json` measurement of the recipe's 200 steps)."""
    per_step = defaultdict(list)
    for r in stored:
        if r.get("schedule", "steps") == "steps":
            per_step[r["config"]].append(r["wall"] / r["optimizer_steps"])
    return {name: statistics.median(values) for name, values in per_step.items()}


def planned_steps(budget: float, seconds: float) -> int:
    """Optimizer steps a configuration taking `seconds` per step fits in `budget` wall seconds (at least one): its
    schedule's length, so that its learning rate reaches 0 at the budget."""
    return max(1, math.floor(budget / seconds))


def run_order(seeds: int, configs=tuple(CONFIGS), first: int = 0) -> list[tuple[int, str]]:
    """(seed, configuration) in measuring order for seeds `first`..`seeds` - 1: seed-major, plain TRL first (its wall
    time is the seed's budget), the other `configs` in `CONFIGS` order, rotated per seed."""
    others = [name for name in CONFIGS if name != "trl" and name in configs]
    return [
        (seed, name)
        for seed in range(first, seeds)
        for name in ["trl", *others[seed % len(others) :], *others[: seed % len(others)]]
    ]


def measure(cli, done: list[dict]) -> tuple[str, list[dict]]:
    """Every configuration for every seed, interleaved, with one server for all runs; runs in `done` (a previous,
    cut-short measurement's records) are kept, not re-run. (header, run records in measuring order).

    Equal time (`cli.equal_time`: a stored equal-steps measurement): every configuration but plain TRL trains for
    the seed's budget with its own schedule, `planned_steps(budget, its seconds_per_step there)`; from `done` it keeps
    plain TRL's runs and the equal-time runs only."""
    schedule, step_times = (TIME_BUDGET if cli.time_budget else "steps"), {}
    if cli.equal_time:
        schedule, step_times = "time", seconds_per_step(json.loads(Path(cli.equal_time).read_text())["runs"])
        unmeasured = [name for name in cli.configs if name != "trl" and name not in step_times]
        if unmeasured:
            raise SystemExit(
                f"--equal-time: {cli.equal_time} has no equal-steps run of {unmeasured}: measure them first "
                f"(--configs trl,{','.join(unmeasured)} --json that file)"
            )
    kept = {
        (r["seed"], r["config"]): r
        for r in done
        if r["config"] == "trl" or r.get("schedule", "steps") == schedule
    }
    runs, budgets = [], {}
    order = run_order(cli.seeds, cli.configs, cli.first_seed)
    missing = any(
        key not in kept for key in order
    )  # with every run kept, only the report is rebuilt: no server
    with (
        tempfile.TemporaryDirectory() as log_dir,
        local_server(free_port(), log_dir) if missing else contextlib.nullcontext() as server,
    ):
        for seed, name in order:
            r = kept.get((seed, name))
            fresh = r is None
            if fresh:
                budget = budgets.get(seed, cli.budget)
                steps = planned_steps(budget, step_times[name]) if step_times and name != "trl" else None
                # equal steps: evaluate every configuration at the same steps
                step_marks = cli.budget is None and not step_times and not cli.time_budget
                by_setting = cli.time_budget and name != "trl"
                r = run(
                    name,
                    seed,
                    budget,
                    cli.points,
                    cli.per_level,
                    server.base_url,
                    steps,
                    step_marks,
                    by_setting,
                )
                print(
                    f"# seed {seed} {name}: {r['wall']:.0f} s, {r['optimizer_steps']} steps, accuracy "
                    f"{r['points'][0]['accuracy']['all']:.3f} -> {r['points'][-1]['accuracy']['all']:.3f}",
                    flush=True,
                )
            runs.append(r)
            # after plain TRL: its wall seconds for 200 steps, unless --budget
            budgets.setdefault(seed, r["budget"])
            if fresh and cli.json:  # every run so far, in case the measurement is cut short
                Path(cli.json).write_text(json.dumps({"partial": True, "runs": runs}, indent=1))
    budget = "plain TRL's 200 steps" if cli.budget is None else f"{cli.budget:.0f} s"
    if step_times:
        budget += (
            ", each configuration its own schedule (equal time: steps planned from " + cli.equal_time + ")"
        )
    if cli.time_budget:
        budget += ", each configuration its own schedule (equal time: steps planned by time_budget_seconds)"
    resumed = f"; {len(kept)} runs kept from --resume" if kept else ""
    if set(cli.configs) != set(CONFIGS):
        resumed += f"; configurations {', '.join(cli.configs)}"
    header = (
        f"chain task ({RECIPE}, LoRA), wall clock on {os.cpu_count()} cores, budget {budget} per seed, "
        f"{cli.points} evaluations of {cli.per_level * len(chain.LEVELS)} held-out problems, "
        f"seeds {cli.first_seed}..{cli.seeds - 1}{resumed}"
    )
    return header, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="measure seeds FIRST_SEED..SEEDS-1 (runs of the others: from --resume, or none)",
    )
    parser.add_argument(
        "--budget", type=float, default=None, help="wall seconds per run (default: TRL's 200 steps)"
    )
    parser.add_argument("--points", type=int, default=8, help="evaluations after the start (a multiple of 4)")
    parser.add_argument(
        "--per-level", type=int, default=chain.HELDOUT_PER_LEVEL, help="held-out problems per level"
    )
    parser.add_argument(
        "--gpu-share", type=float, default=GPU_SHARE, help="generation share of the modeled step"
    )
    parser.add_argument("--json", default=None, help="write every run and the summary here")
    parser.add_argument("--quick", action="store_true", help="1 seed, 15 s, 2 points, 200 held-out problems")
    parser.add_argument(
        "--configs",
        type=lambda text: text.split(","),
        default=list(CONFIGS),
        help=f"comma-separated, plain TRL included (it sets each seed's budget): {','.join(CONFIGS)}",
    )
    parser.add_argument(
        "--resume", default=None, help="a --json file of a cut-short measurement: keep its runs, run the rest"
    )
    parser.add_argument(
        "--equal-time",
        default=None,
        metavar="STEPS_JSON",
        help="each configuration trains for plain TRL's wall time with its own max_steps: the budget over its median "
        "seconds per step in this equal-steps --json measurement",
    )
    parser.add_argument(
        "--time-budget",
        action="store_true",
        help="equal time by the setting: every configuration but plain TRL trains with time_budget_seconds = plain "
        "TRL's wall time, which plans its steps from its own pace (docs/time-budget.md)",
    )
    cli = parser.parse_args()
    if cli.time_budget and (cli.equal_time or cli.budget is not None):
        parser.error(
            "--time-budget: the budget is plain TRL's wall time; leave out --equal-time and --budget"
        )
    if cli.equal_time and cli.budget is not None:
        parser.error(
            "--equal-time: the budget is plain TRL's wall time for its 200 steps; leave out --budget"
        )
    unknown = [name for name in cli.configs if name not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; choose from {list(CONFIGS)}")
    if "trl" not in cli.configs:
        parser.error("--configs: add trl (plain TRL's wall time is each seed's budget)")
    if cli.quick:
        cli.seeds, cli.budget, cli.points, cli.per_level = 1, 15.0, 2, 50
    elif cli.points % 4:
        raise SystemExit(
            f"--points must be a multiple of 4 (targets at 50 % and 75 % of the budget), got {cli.points}"
        )
    done = json.loads(Path(cli.resume).read_text())["runs"] if cli.resume else []
    header, runs = measure(cli, done)
    summary = summarize(runs, cli.gpu_share)
    if cli.json:
        Path(cli.json).write_text(json.dumps({"header": header, "runs": runs, "summary": summary}, indent=1))
    print_report(runs, summary, header)


if __name__ == "__main__":
    sys.exit(main())
