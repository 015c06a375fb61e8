"""The summary and report of `benchmarks.accuracy.time_to_accuracy` on its two clocks, the measured CPU clock
and the modeled GPU clock (`benchmarks.accuracy.clocks`): targets, times to them and ratios to plain TRL
(`benchmarks.accuracy.tta_harness`) per clock, the work done, the curves and the plot.
Input: {config: [evaluation points of one run, per seed]}.
"""

import math
import statistics

from benchmarks.accuracy import clocks
from benchmarks.accuracy import tta_harness as harness
from benchmarks.common import print_table


def calibration(trl_runs: list[list[dict]], share: float) -> clocks.UnitCosts:
    """GPU unit costs from plain TRL's totals at the end of its runs, mean over seeds."""
    finals = [runs[-1] for runs in trl_runs]
    mean = {k: statistics.fmean(p[k] for p in finals) for k in ("generated_rows", "micro_steps", "time")}
    return clocks.calibrate(mean["generated_rows"], mean["micro_steps"], mean["time"], share)


def clock_times(runs: list[dict], clock: str, costs: clocks.UnitCosts) -> list[float]:
    """The evaluation times of one run on `clock` ("cpu": measured; "gpu": modeled with `costs`)."""
    if clock == "cpu":
        return [p["time"] for p in runs]
    return [costs.seconds(p["generated_rows"], p["micro_steps"]) for p in runs]


def summarize(results: dict, budget: float, share: float = clocks.GPU_GENERATION_SHARE) -> dict:
    """Targets (`tta_harness.targets`) and, per configuration and clock: time to each target per seed and its ratio to
    plain TRL's mean curve's (`tta_harness.target_cells`), accuracy at TRL's full budget; work at the end."""
    costs = calibration(results["trl"], share)
    goals = harness.targets(results["trl"])  # on plain TRL's (CPU) grid
    clock_names = ("cpu", "gpu")
    trl_curves = {  # plain TRL's mean curve, per clock
        clock: harness.mean_curve(
            [(clock_times(runs, clock, costs), harness.accuracies(runs)) for runs in results["trl"]]
        )
        for clock in clock_names
    }
    table = {}
    for name, seeds in results.items():
        row = {"final_accuracy": [runs[-1]["accuracy"]["all"] for runs in seeds]}
        accuracies = [harness.accuracies(runs) for runs in seeds]
        for clock in clock_names:
            times = [clock_times(runs, clock, costs) for runs in seeds]
            per_clock = harness.target_cells(
                list(zip(times, accuracies, strict=True)), trl_curves[clock], goals
            )
            per_clock["accuracy_at_budget"] = [
                clocks.accuracy_at(t, a, budget) for t, a in zip(times, accuracies, strict=True)
            ]
            row[clock] = per_clock
        finals = [runs[-1] for runs in seeds]
        row.update(
            {key: statistics.median(p[key] for p in finals) for key in WORK_KEYS},
            generation_share=statistics.median(p["generation_seconds"] / p["time"] for p in finals),
        )
        table[name] = row
    return {"targets": goals, "budget": budget, "gpu_share": share, "costs": vars(costs), "configs": table}


WORK_KEYS = ("generated_tokens", "generated_rows", "trained_rows", "micro_steps", "optimizer_steps")


def print_report(results: dict, summary: dict, header: str, measured: str = "CPU") -> None:
    """The report; `measured` names the measured clock ("CPU", or a GPU's wall clock), the "cpu" rows of `summary`."""
    print(header)
    print(
        f"targets = plain TRL's mean held-out accuracy at a fraction of its budget: {harness.targets_line(summary['targets'])}"
    )
    print(
        f"GPU clock: generated rows x {summary['costs']['row']:.3g} s + micro-steps x "
        f"{summary['costs']['micro_step']:.3g} s (plain TRL's generation share {summary['gpu_share']:.0%})"
    )
    trl = summary["configs"]["trl"]
    for clock in ("cpu", "gpu"):
        name = (
            f"{measured} clock"
            if clock == "cpu"
            else "GPU clock" + (" (modeled)" if measured != "CPU" else "")
        )
        print(f"\n{name}: median ratio of the time to each target to plain TRL's (per seed)")
        rows = [
            [name, *(harness.ratio_cell(row[clock][f]) for f in summary["targets"]),
             f"{statistics.fmean(row[clock]['accuracy_at_budget']):.3f}"]
            for name, row in summary["configs"].items()
        ]  # fmt: skip
        heads = [f"to {float(f):.0%} target" for f in summary["targets"]]
        print_table(["config", *heads, "accuracy at TRL's budget (mean)"], rows, right=False)
    print("\nWork at the end of each run, median over seeds (ratio to plain TRL):")
    rows = [
        [name, harness.joined(row["final_accuracy"], ".3f"),
         *(f"{row[k]:.0f} ({row[k] / trl[k]:.2f}x)" for k in WORK_KEYS), f"{row['generation_share']:.2f}"]
        for name, row in summary["configs"].items()
    ]  # fmt: skip
    heads = [k.replace("_", " ") for k in WORK_KEYS]
    print_table(
        ["config", "final accuracy (per seed)", *heads, f"generation share ({measured})"], rows, right=False
    )
    print(
        "\nHeld-out accuracy at each evaluation point, mean over seeds (all-correct / all-wrong group shares since"
    )
    print("the previous point in brackets; each run sampled at the CPU grid, see on_grid):")
    budget, points = summary["budget"], len(results["trl"][0]) - 1
    for name, seeds in results.items():
        columns = [
            curve(seeds, key, budget, points) for key in ("time", "accuracy", "all_correct", "all_wrong")
        ]
        cells = [f"{t:.0f}s {a:.3f} ({c:.2f}/{w:.2f})" for t, a, c, w in zip(*columns, strict=True)]
        print(f"- {name}: " + ", ".join(cells))


def print_sensitivity(results: dict, budget: float) -> None:
    """The GPU-clock median ratios again at the other generation shares of `clocks.SENSITIVITY_SHARES`."""
    for share in clocks.SENSITIVITY_SHARES:
        summary = summarize(results, budget, share)
        print(f"\nGPU clock at a {share:.0%} generation share for plain TRL: median ratio to each target")
        for name, row in summary["configs"].items():
            cells = [
                f"{float(f):.0%} {harness.joined([row['gpu'][f]['median_ratio']])}"
                for f in summary["targets"]
            ]
            print(f"- {name}: " + ", ".join(cells))


# the modeled clock's ratios must lie within this of the measured ones (docs/time-to-accuracy.md)
CLOCK_GOAL = 0.1
SHARE_GRID = [k / 100 for k in range(50, 100)]  # the generation shares the recalibration tries


def clock_gaps(summary: dict) -> list[dict]:
    """Every per-seed ratio to a target that both clocks reached (finite): its configuration, target, seed index,
    measured ("cpu") and modeled ("gpu") ratio and the gap between them, largest gap first."""
    gaps = []
    for name, row in summary["configs"].items():
        for fraction in summary["targets"]:
            pairs = zip(
                row["cpu"][fraction]["ratio_to_trl"], row["gpu"][fraction]["ratio_to_trl"], strict=True
            )
            for seed, (measured, modeled) in enumerate(pairs):
                if None not in (measured, modeled) and math.isfinite(measured) and math.isfinite(modeled):
                    gap = abs(modeled - measured)
                    gaps.append({"config": name, "target": fraction, "seed": seed, "gap": gap,
                                 "measured": measured, "modeled": modeled})  # fmt: skip
    return sorted(gaps, key=lambda g: -g["gap"])


def print_clock_check(results: dict, budget: float, seeds: list[int]) -> None:
    """For runs measured on a GPU: how far the modeled clock's per-seed ratios lie from the measured ones, at the
    model's generation share, at plain TRL's measured one, and at the share of `SHARE_GRID` whose largest gap is
    smallest (the recalibration, when the model's share misses `CLOCK_GOAL`)."""
    measured_share = summarize(results, budget)["configs"]["trl"]["generation_share"]
    largest = {share: clock_gaps(summarize(results, budget, share)) for share in SHARE_GRID}
    best = min(SHARE_GRID, key=lambda share: largest[share][0]["gap"] if largest[share] else math.inf)
    print(f"\nModeled against measured clock: per-seed ratios to every target (goal: within {CLOCK_GOAL})")
    for label, share in (
        ("the model's", clocks.GPU_GENERATION_SHARE),
        ("plain TRL's measured", measured_share),
        ("the best of 50-99 %", best),
    ):
        gaps = clock_gaps(summarize(results, budget, share))
        if not gaps:
            print(f"- at {label} share {share:.0%}: no ratio reached on both clocks")
            continue
        top = gaps[0]
        verdict = "within" if top["gap"] <= CLOCK_GOAL else "past"
        print(
            f"- at {label} share {share:.0%}: largest gap {top['gap']:.3f} ({verdict} {CLOCK_GOAL}; {top['config']}, "
            f"{float(top['target']):.0%} target, seed {seeds[top['seed']]}: modeled {top['modeled']:.2f}, measured "
            f"{top['measured']:.2f}), median gap {statistics.median(g['gap'] for g in gaps):.3f} over {len(gaps)}"
        )


def on_grid(runs: list[dict], budget: float, points: int) -> list[dict]:
    """One run sampled at the CPU grid k * budget / points (k = 0..points): the accuracy of the evaluation closest
    to each grid time, and the all-correct / all-wrong shares of the groups generated up to the evaluations whose
    nearest grid time is k (their shares weighted by the rows each generated)."""
    grid = [budget * k / points for k in range(points + 1)]
    times, accuracies = [p["time"] for p in runs], [p["accuracy"]["all"] for p in runs]
    sampled = []
    for k, at in enumerate(grid):
        inside = [  # (evaluation, rows generated since the one before) of the evaluations nearest to grid time k
            (p, p["generated_rows"] - runs[i - 1]["generated_rows"])
            for i, p in enumerate(runs)
            if i and min(max(round(p["time"] * points / budget), 1), points) == k
        ]
        rows = sum(n for _, n in inside) or 1
        shares = {kind: sum(p[kind] * n for p, n in inside) / rows for kind in ("all_correct", "all_wrong")}
        sampled.append({"time": at, "accuracy": clocks.accuracy_at(times, accuracies, at), **shares})
    return sampled


def curve(seeds: list[list[dict]], key: str, budget: float, points: int) -> list[float]:
    """Per CPU grid time (`on_grid`), the mean over seeds of `key` (time, accuracy, all_correct, all_wrong)."""
    sampled = [on_grid(runs, budget, points) for runs in seeds]
    return [statistics.fmean(run[k][key] for run in sampled) for k in range(points + 1)]


def plot(
    results: dict, summary: dict, path: str, title: str, measured: str = "training CPU seconds, one core"
) -> None:
    """Accuracy against the measured clock (`measured`: its axis label) and the modeled GPU clock, every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = clocks.UnitCosts(**summary["costs"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, clock in zip(axes, ("cpu", "gpu"), strict=True):
        for name, seeds in results.items():
            for i, runs in enumerate(seeds):
                ax.plot(
                    clock_times(runs, clock, costs),
                    [p["accuracy"]["all"] for p in runs],
                    marker=".",
                    color=f"C{list(results).index(name)}",
                    alpha=0.8,
                    linewidth=1,
                    label=name if i == 0 else None,
                )
        for target in summary["targets"].values():
            ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel(
            measured
            if clock == "cpu"
            else f"modeled GPU seconds ({summary['gpu_share']:.0%} generation for TRL)"
        )
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out accuracy (2,000 problems); dashed: targets")
    axes[0].legend(fontsize=7, loc="lower right", ncol=2)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
