"""Time-to-accuracy summary and report: targets, times to them and ratios to plain TRL on the CPU clock and the
modeled GPU clock (`benchmarks.clocks`), the work done, the curves and the plot. Input: {config: [evaluation
points of one run, per seed]} from `benchmarks.time_to_accuracy`.
"""

import statistics

from benchmarks import clocks


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


def mean_curve(trl_runs: list[list[dict]], clock: str, costs: clocks.UnitCosts) -> tuple[list, list]:
    """Plain TRL's (times, accuracies) on `clock`, mean over seeds point by point (its points share one grid)."""
    length = min(map(len, trl_runs))
    times = [clock_times(runs, clock, costs)[:length] for runs in trl_runs]
    accuracies = [[p["accuracy"]["all"] for p in runs[:length]] for runs in trl_runs]
    return [statistics.fmean(t) for t in zip(*times, strict=True)], [
        statistics.fmean(a) for a in zip(*accuracies, strict=True)
    ]


def summarize(results: dict, budget: float, share: float = clocks.GPU_GENERATION_SHARE) -> dict:
    """Targets (plain TRL's mean accuracy at `TARGET_FRACTIONS` of its budget) and, per configuration and clock:
    time to each target per seed, its ratio to the time plain TRL's mean curve takes (so a TRL seed below the mean
    does not leave the ratio undefined), their median, accuracy at TRL's full budget; work at the end."""
    costs = calibration(results["trl"], share)
    trl_points = len(results["trl"][0]) - 1  # evaluations after the start, on plain TRL's (CPU) grid
    targets = {
        str(f): statistics.fmean(runs[round(f * trl_points)]["accuracy"]["all"] for runs in results["trl"])
        for f in clocks.TARGET_FRACTIONS
    }
    clock_names = ("cpu", "gpu")
    trl_times = {  # plain TRL's mean curve's time to each target, per clock
        clock: {
            f: clocks.reached_at(*mean_curve(results["trl"], clock, costs), t) for f, t in targets.items()
        }
        for clock in clock_names
    }
    table = {}
    for name, seeds in results.items():
        row = {"final_accuracy": [runs[-1]["accuracy"]["all"] for runs in seeds]}
        accuracies = [[p["accuracy"]["all"] for p in runs] for runs in seeds]
        for clock in clock_names:
            times = [clock_times(runs, clock, costs) for runs in seeds]
            per_clock = {}
            for fraction, target in targets.items():
                theirs = trl_times[clock][fraction]
                reached = [clocks.reached_at(t, a, target) for t, a in zip(times, accuracies, strict=True)]
                ratios = [clocks.time_ratio(mine, theirs) for mine in reached]
                per_clock[fraction] = {
                    "time_to_target": reached,
                    "trl_time_to_target": theirs,
                    "ratio_to_trl": ratios,
                    "median_ratio": statistics.median(ratios) if None not in ratios else None,
                }
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
    return {"targets": targets, "budget": budget, "gpu_share": share, "costs": vars(costs), "configs": table}


WORK_KEYS = ("generated_tokens", "generated_rows", "trained_rows", "micro_steps", "optimizer_steps")


def _fmt(values, spec=".2f") -> str:
    return " / ".join(
        "never" if v is None else ("inf" if v == float("inf") else format(v, spec)) for v in values
    )


def _mean(values) -> str:
    return f"{statistics.fmean(values):.3f}"


def print_report(results: dict, summary: dict, header: str, measured: str = "CPU") -> None:
    """The report; `measured` names the measured clock ("CPU", or a GPU's wall clock), the "cpu" rows of `summary`."""
    print(header)
    targets = ", ".join(f"{float(f):.0%} {t:.4f}" for f, t in summary["targets"].items())
    print(f"targets = plain TRL's mean held-out accuracy at a fraction of its budget: {targets}")
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
        print(
            "| config | "
            + " | ".join(f"to {float(f):.0%} target" for f in summary["targets"])
            + " | accuracy at TRL's budget (mean) |"
        )
        print("|---" * (len(summary["targets"]) + 2) + "|")
        for name, row in summary["configs"].items():
            cells = []
            for fraction in summary["targets"]:
                cell = row[clock][fraction]
                median = (
                    "never (some seed)" if cell["median_ratio"] is None else f"**{cell['median_ratio']:.2f}**"
                )
                cells.append(f"{median} ({_fmt(cell['ratio_to_trl'])})")
            print(f"| {name} | " + " | ".join(cells) + f" | {_mean(row[clock]['accuracy_at_budget'])} |")
    print("\nWork at the end of each run, median over seeds (ratio to plain TRL):")
    print(
        "| config | final accuracy (per seed) | "
        + " | ".join(k.replace("_", " ") for k in WORK_KEYS)
        + f" | generation share ({measured}) |"
    )
    print("|---" * (len(WORK_KEYS) + 3) + "|")
    for name, row in summary["configs"].items():
        work = " | ".join(f"{row[k]:.0f} ({row[k] / trl[k]:.2f}x)" for k in WORK_KEYS)
        print(f"| {name} | {_fmt(row['final_accuracy'], '.3f')} | {work} | {row['generation_share']:.2f} |")
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
            cells = [f"{float(f):.0%} {_fmt([row['gpu'][f]['median_ratio']])}" for f in summary["targets"]]
            print(f"- {name}: " + ", ".join(cells))


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
