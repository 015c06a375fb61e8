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
75 and 100 % of its budget (100 % = its final accuracy); reached: `benchmarks.accuracy.clocks.reached_at`;
ratio: a run's time over the time plain TRL's mean curve takes (docs/time-to-accuracy.md).

Two-device model: per run, generation G (the engine's seconds per step), training T (the trainer's step time minus
its waits for generation and the sync) and sync S per step. With G rescaled so that G / (G + T) = `--gpu-share`, a
synchronous step costs G + T + S and an asynchronous one max(G, T) + S: overlap buys at most 1 / max(share, 1 - share).

    python -m benchmarks.accuracy.async_wall_clock [--seeds 3] [--points 8] [--budget S] [--json out.json]
    python -m benchmarks.accuracy.async_wall_clock --seeds 3 --resume out.json --json out.json   # finish one
    python -m benchmarks.accuracy.async_wall_clock --seeds 3 --time-budget --configs trl,server-async+filter
    python -m benchmarks.accuracy.async_wall_clock --quick   # smoke run: 1 seed, 15 s, 2 points, 200 problems
"""

import argparse
import contextlib
import math
import os
import socket
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoTokenizer
from trl import GRPOConfig

from benchmarks import chain_testbed as testbed
from benchmarks.accuracy import clocks
from benchmarks.accuracy import tta_harness as harness
from benchmarks.accuracy.wall_clock_meter import DIAGNOSTICS, Meter
from benchmarks.common import QUIET_CPU_RUN, print_table
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


def pin(cores: set[int]) -> None:
    """Every thread of this process onto `cores`, one torch thread per core (new threads inherit the affinity)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cores)
    torch.set_num_threads(len(cores))


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
    fields, lora = testbed.recipe_settings(RECIPE)
    prompts = fields.pop("num_prompts")
    if max_steps is not None:
        fields["max_steps"] = max_steps
    if time_budget:
        fields |= {"max_steps": TIME_BUDGET_CAP, "time_budget_seconds": budget}
    common = {**fields, "output_dir": tempfile.mkdtemp(), **QUIET_CPU_RUN, "seed": seed}
    settings = CONFIGS[name]
    if settings is None:
        pin({TRAINER_CORE, SERVER_CORE})
        args = GRPOConfig(**testbed.plain_trl(common))
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
    trainer = testbed.chain_trainer(args, meter, lora, prompts, seed)
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
    """Targets and per configuration: time to each target per seed, its ratio to plain TRL's mean curve's time,
    their median, accuracy at TRL's budget (`tta_harness`), its accuracy at `STEP_MARKS` optimizer steps paired with
    plain TRL's by seed, the mean IS diagnostics, and the modeled two-device ratio of each run (at the measured
    generation share and at `share`)."""
    by_config = defaultdict(list)
    for r in runs:
        by_config[r["config"]].append(r)
    trl = [r["points"] for r in by_config["trl"]]
    if any(len(points) != len(trl[0]) for points in trl):
        raise SystemExit(
            "plain TRL ended its 200 steps before --budget in some seed: lower --budget or leave it out"
        )
    goals = harness.targets(trl)
    # each point's `time`: wall seconds
    trl_curve = harness.mean_curve(
        [([p["time"] for p in points], harness.accuracies(points)) for points in trl]
    )
    table = {}
    for name, rs in by_config.items():
        curves = [([p["time"] for p in r["points"]], harness.accuracies(r["points"])) for r in rs]
        table[name] = {
            "seeds": [r["seed"] for r in rs],
            "final_accuracy": [a[-1] for _, a in curves],
            **harness.target_cells(curves, trl_curve, goals),
            "accuracy_at_budget": [
                clocks.accuracy_at(t, a, r["budget"]) for (t, a), r in zip(curves, rs, strict=True)
            ],
            **harness.per_step_columns(rs, by_config["trl"], STEP_MARKS),
            "diagnostics": mean_diagnostics(rs),
            "modeled": [
                {
                    "measured_share": s["generation"] / (s["generation"] + s["training"]),
                    "at_measured_share": two_device_ratio(s["generation"], s["training"], s["sync"], None),
                    "at_share": two_device_ratio(s["generation"], s["training"], s["sync"], share),
                }
                for s in (r["per_step"] for r in rs)
            ],
        }
    return {"targets": goals, "gpu_share": share, "configs": table}


def _steps(run: dict) -> str:
    """Optimizer steps run, and of how many its schedule planned when it had its own (equal time)."""
    planned = ""
    if run.get("schedule") == "time":
        planned = f" of {run['max_steps']}"
    elif run.get("schedule") == TIME_BUDGET:
        planned = f" of {run['planned_steps']} (by the setting)"
    return f"{run['optimizer_steps']}{planned}"


def print_report(runs: list[dict], summary: dict, header: str) -> None:
    """The report: targets and the time to each, accuracy per optimizer step (`tta_harness`), the IS and staleness
    diagnostics, each run's work and time split, and the two-device model."""
    print(header)
    print(
        "targets = plain TRL's mean held-out accuracy at a fraction of its budget (100 % = final): "
        f"{harness.targets_line(summary['targets'])}\n"
    )
    print("Wall-clock time to each target: median ratio to plain TRL's mean curve (per seed: ratio; seconds)")
    rows = [
        [name, *(harness.ratio_cell(row[f], seconds=True) for f in summary["targets"]),
         f"{statistics.fmean(row['accuracy_at_budget']):.3f}", harness.joined(row["final_accuracy"], ".3f")]
        for name, row in summary["configs"].items()
    ]  # fmt: skip
    heads = [f"to {float(f):.0%}" for f in summary["targets"]]
    print_table(["config", *heads, "accuracy at TRL's budget (mean)", "final (per seed)"], rows)
    harness.print_per_step(summary["configs"], STEP_MARKS)
    print("\nIS and staleness diagnostics, mean over every logged step of every seed")
    rows = [
        [name, *(harness.dash(row["diagnostics"].get(d), ".4g") for d in DIAGNOSTICS)]
        for name, row in summary["configs"].items()
    ]
    print_table(["config", *DIAGNOSTICS], rows)
    print("\nWork and seconds per optimizer step of each run (blocked: the trainer waiting for generation):")
    rows = []
    for r in runs:
        s, wait = r["per_step"], r["mean_logged_wait"]
        rows.append(
            [f"{r['config']} seed {r['seed']}", f"{r['wall']:.0f}", _steps(r), str(r["generated_tokens"]),
             str(r["trained_rows"]), f"{r['mean_staleness']:.2f}", harness.dash(wait, ".3f"),
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


def measure(cli, done: list[dict]) -> tuple[str, list[dict]]:
    """Every configuration for every seed, interleaved, with one server for all runs; runs in `done` (a previous,
    cut-short measurement's records) are kept, not re-run. (header, run records in measuring order).

    Equal time (`cli.equal_time`: a stored equal-steps measurement): every configuration but plain TRL trains for
    the seed's budget with its own schedule, `planned_steps(budget, its seconds_per_step there)`; from `done` it keeps
    plain TRL's runs and the equal-time runs only."""
    schedule, step_times = (TIME_BUDGET if cli.time_budget else "steps"), {}
    if cli.equal_time:
        schedule, step_times = "time", seconds_per_step(harness.read_stored(cli.equal_time)["runs"])
        unmeasured = [name for name in cli.configs if name != "trl" and name not in step_times]
        if unmeasured:
            raise SystemExit(
                f"--equal-time: {cli.equal_time} has no equal-steps run of {unmeasured}: measure them first "
                f"(--configs trl,{','.join(unmeasured)} --json that file)"
            )
    kept = harness.kept_runs(done, lambda r: r["config"] == "trl" or r.get("schedule", "steps") == schedule)
    runs, budgets = [], {}
    order = harness.run_order(
        range(cli.first_seed, cli.seeds), [name for name in CONFIGS if name in cli.configs]
    )
    # with every run kept, only the report is rebuilt: no server
    missing = any(key not in kept for key in order)
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
                harness.store(cli.json, {"partial": True, "runs": runs})
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
    harness.add_arguments(parser, points=8)
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="measure seeds FIRST_SEED..SEEDS-1 (runs of the others: from --resume, or none)",
    )
    parser.add_argument(
        "--budget", type=float, default=None, help="wall seconds per run (default: TRL's 200 steps)"
    )
    parser.add_argument(
        "--gpu-share", type=float, default=GPU_SHARE, help="generation share of the modeled step"
    )
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
    else:
        harness.check_points(cli.points)
    done = harness.read_stored(cli.resume)["runs"] if cli.resume else []
    header, runs = measure(cli, done)
    summary = summarize(runs, cli.gpu_share)
    if cli.json:
        harness.store(cli.json, {"header": header, "runs": runs, "summary": summary})
    print_report(runs, summary, header)


if __name__ == "__main__":
    sys.exit(main())
