"""The time-to-accuracy harness of `benchmarks.accuracy.time_to_accuracy` and
`benchmarks.accuracy.async_wall_clock`: what both do around what each measures.

- Runs by seed and configuration (on the chain testbed of benchmarks/chain_testbed.py): the measuring order
  (`run_order`: seed-major, plain TRL first, the others rotated per seed, so that drifting machine load hits every
  configuration alike).
- Resume and the stored JSON: `kept_runs`, `read_stored`, `store`.
- The summary: targets (plain TRL's mean held-out accuracy at `clocks.TARGET_FRACTIONS` of its budget), each run's time
  to each target (`clocks.reached_at`) and its ratio to the time plain TRL's mean curve takes (`target_cells`); accuracy
  per optimizer step, and its difference to plain TRL paired by seed with standard errors (`per_step_columns`).
- The report: its cells (`ratio_cell`, `joined`, `dash`, `targets_line`) and the per-step tables (`print_per_step`).
- The command line both share: `add_arguments`, `check_points`.
"""

import argparse
import itertools
import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from benchmarks.accuracy import clocks
from benchmarks.common import print_table
from grpo_hub.tasks import chain


def run_order(seeds: Iterable[int], names: Sequence[str]) -> list[tuple[int, str]]:
    """(seed, configuration) in measuring order: seed-major, plain TRL first when among `names` (its run sets the
    seed's budget or calibrates its clock), the others in `names` order rotated by the seed."""
    others = [name for name in names if name != "trl"]
    first = ["trl"] if "trl" in names else []
    order = []
    for seed in seeds:
        shift = seed % len(others) if others else 0
        order += [(seed, name) for name in [*first, *others[shift:], *others[:shift]]]
    return order


def kept_runs(done: list[dict], keep: Callable[[dict], bool]) -> dict[tuple[int, str], dict]:
    """The runs of a cut-short measurement that `keep` accepts, by (seed, configuration): a resumed one runs the rest."""
    return {(r["seed"], r["config"]): r for r in done if keep(r)}


def read_stored(path: str) -> dict:
    """A stored measurement (a `--json` file)."""
    return json.loads(Path(path).read_text())


def store(path: str, content: dict) -> None:
    """Write a measurement as its `--json` file (indented by one space, as every stored one in docs/)."""
    Path(path).write_text(json.dumps(content, indent=1))


def accuracies(points: list[dict]) -> list[float]:
    """Held-out accuracy (all levels) at each evaluation point of a run."""
    return [p["accuracy"]["all"] for p in points]


def mean_curve(curves: list[tuple[list[float], list[float]]]) -> tuple[list[float], list[float]]:
    """The (times, accuracies) of several runs, mean over them point by point (plain TRL's runs share one grid), cut
    to the shortest."""
    length = min(len(times) for times, _ in curves)
    times = [statistics.fmean(column) for column in zip(*(t[:length] for t, _ in curves), strict=True)]
    accs = [statistics.fmean(column) for column in zip(*(a[:length] for _, a in curves), strict=True)]
    return times, accs


def targets(trl: list[list[dict]]) -> dict[str, float]:
    """Plain TRL's mean accuracy at each of `clocks.TARGET_FRACTIONS` of its budget, by fraction (its runs' `trl`
    evaluation points are evenly spaced over the budget)."""
    n = len(trl[0]) - 1  # evaluations after the start
    return {
        str(f): statistics.fmean(points[round(f * n)]["accuracy"]["all"] for points in trl)
        for f in clocks.TARGET_FRACTIONS
    }


def target_cells(
    curves: list[tuple[list, list]], trl_curve: tuple[list, list], goals: dict[str, float]
) -> dict:
    """Per target fraction of `goals`: each run's (`curves`: times, accuracies) time to the target, plain TRL's mean
    curve's, their ratio per run (so that a TRL seed below the mean does not leave it undefined) and its median (None
    when some run never got there)."""
    cells = {}
    for fraction, target in goals.items():
        theirs = clocks.reached_at(*trl_curve, target)
        reached = [clocks.reached_at(t, a, target) for t, a in curves]
        ratios = [clocks.time_ratio(mine, theirs) for mine in reached]
        cells[fraction] = {
            "time_to_target": reached,
            "trl_time_to_target": theirs,
            "ratio_to_trl": ratios,
            "median_ratio": statistics.median(ratios) if None not in ratios else None,
        }
    return cells


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


def per_step_columns(runs: list[dict], trl: list[dict], marks: Sequence[int]) -> dict:
    """A configuration's `runs` (records with "seed" and "points") at each of `marks` optimizer steps: accuracy per run
    (None: stopped before), its standard error over the runs that got there, and the difference to plain TRL's runs
    `trl` paired by seed (`paired_to_trl`)."""
    at_steps = {str(step): [accuracy_at_step(r["points"], step) for r in runs] for step in marks}
    return {
        "accuracy_at_steps": at_steps,
        "standard_error_at_steps": {
            step: standard_error([v for v in values if v is not None]) for step, values in at_steps.items()
        },
        "paired_to_trl_at_steps": {str(step): paired_to_trl(trl, runs, step) for step in marks},
    }


def joined(values, spec: str = ".2f") -> str:
    """Values per seed, " / "-separated, "never" for None."""
    return " / ".join("never" if v is None else format(v, spec) for v in values)


def dash(value, spec: str) -> str:
    """`value` formatted, "-" for None."""
    return "-" if value is None else format(value, spec)


def targets_line(goals: dict[str, float]) -> str:
    """The targets as the report names them: "50% 0.3775, 75% 0.3900, 100% 0.3842"."""
    return ", ".join(f"{float(f):.0%} {t:.4f}" for f, t in goals.items())


def ratio_cell(cell: dict, seconds: bool = False) -> str:
    """A `target_cells` cell: the median ratio in bold (or "never (some seed)"), then the ratio per seed (and with
    `seconds` the time to the target per seed)."""
    median = "never (some seed)" if cell["median_ratio"] is None else f"**{cell['median_ratio']:.2f}**"
    detail = joined(cell["ratio_to_trl"])
    if seconds:
        detail += f"; {joined(cell['time_to_target'], '.0f')} s"
    return f"{median} ({detail})"


def print_per_step(configs: dict, marks: Sequence[int]) -> None:
    """The report's tables of `per_step_columns` (`configs`: name -> its summary row): accuracy per run by optimizer
    step, then the mean ± standard error and the difference to plain TRL paired by seed."""
    print(
        "\nHeld-out accuracy by optimizer step (mean of the seeds that got there; per seed, '-': stopped before)"
    )
    rows = []
    for name, row in configs.items():
        cells = []
        for values in row["accuracy_at_steps"].values():
            reached = [v for v in values if v is not None]
            mean = f"{statistics.fmean(reached):.3f}" if reached else "-"
            cells.append(f"{mean} ({' / '.join(dash(v, '.3f') for v in values)})")
        rows.append([name, *cells])
    print_table(["config", *(f"step {step}" for step in marks)], rows)
    print(
        "\nBy optimizer step, paired by seed: mean (± standard error) of the seeds; its difference to plain TRL (± SE)"
    )
    rows = []
    for name, row in configs.items():
        cells = []
        for step, values in row["accuracy_at_steps"].items():
            reached, se = [v for v in values if v is not None], row["standard_error_at_steps"][step]
            paired = row["paired_to_trl_at_steps"][step]
            mine = f"{statistics.fmean(reached):.3f} ± {dash(se, '.3f')}" if reached else "-"
            difference = (
                "-" if paired["mean"] is None else f"{paired['mean']:+.3f} ± {dash(paired['se'], '.3f')}"
            )
            cells.append(f"{mine}; {difference} (n {paired['n']})")
        rows.append([name, *cells])
    print_table(["config", *(f"step {step}" for step in marks)], rows)


def add_arguments(parser: argparse.ArgumentParser, points: int) -> None:
    """The arguments both benchmarks take: seeds, evaluations (`points` by default), held-out problems, --json."""
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--points",
        type=int,
        default=points,
        help="evaluations after the start, evenly spaced (a multiple of 4)",
    )
    parser.add_argument(
        "--per-level", type=int, default=chain.HELDOUT_PER_LEVEL, help="held-out problems per level evaluated"
    )
    parser.add_argument("--json", default=None, help="write every run and the summary here")


def check_points(points: int) -> None:
    """The targets at 50 % and 75 % of the budget fall on evaluations: `points` must be a multiple of 4."""
    if points % 4:
        raise SystemExit(
            f"--points must be a multiple of 4 (targets at 50 % and 75 % of the budget), got {points}"
        )
