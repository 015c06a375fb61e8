"""Run every benchmark, one after the other, each in its own process: `python -m benchmarks [--quick]`.

Prints the machine and its load first (the numbers mean little without them), then each benchmark's
Markdown tables. `--quick` runs each benchmark's smallest setting (a smoke run; its ratios are noise).
`--only NAME ...` runs a subset. `--device cuda` runs the benchmarks that have a CUDA path (bf16, synchronized
wall time, peak memory: `DEVICE_AWARE`) on the GPU and says which others it skips (they are CPU-only).
"""

import argparse
import datetime
import os
import platform
import subprocess
import sys

import torch
import trl

from benchmarks.common import check_device

# Benchmark -> its module and its arguments for a --quick run.
BENCHMARKS = {
    "step_time": ("benchmarks.step_cost.step_time", ["--quick"]),
    "memory": ("benchmarks.step_cost.memory", ["--quick"]),
    "filtering": (
        "benchmarks.step_cost.filtering",
        ["--reps", "1", "--steps", "1", "--batch", "4", "--completion-length", "8"],
    ),
    "reference": ("benchmarks.step_cost.reference", ["--skip-05b", "--steps", "2", "--repeats", "2"]),
    "dynamic_sampling": ("benchmarks.accuracy.dynamic_sampling", ["--steps", "3"]),
    "selective_rollout": ("benchmarks.accuracy.selective_rollout", ["--quick"]),
    "time_to_accuracy": ("benchmarks.accuracy.time_to_accuracy", ["--quick"]),
    "scoring_forward": ("benchmarks.step_cost.scoring_forward", ["--quick"]),
    "padding_free": ("benchmarks.step_cost.padding_free", ["--quick"]),
    "pass_at_k": ("benchmarks.accuracy.pass_at_k", ["--quick"]),
    "hint_reach": ("benchmarks.accuracy.hint_reach", ["--quick"]),
    "shared_prompts": ("benchmarks.step_cost.shared_prompts", ["--quick"]),
    "rollout_budget": ("benchmarks.step_cost.rollout_budget", ["--quick"]),
}
DEVICE_AWARE = (
    "filtering",
    "scoring_forward",
    "shared_prompts",
)  # benchmarks whose --device cuda path this runner uses


def machine_line() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{now}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average {load}; "
        f"torch {torch.__version__}, trl {trl.__version__}, python {platform.python_version()}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smallest setting of every benchmark")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run only these benchmarks")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    cli = parser.parse_args(argv)
    if cli.device == "cuda":
        check_device(cli.device)
    failed = []
    for name in cli.only or BENCHMARKS:
        module, quick = BENCHMARKS[name]
        if cli.device == "cuda" and name not in DEVICE_AWARE:
            print(f"\n# {module} — skipped: CPU-only (no --device cuda path)", flush=True)
            continue
        print(f"\n# {module} — {machine_line()}", flush=True)
        command = [sys.executable, "-m", module, *(quick if cli.quick else [])]
        if name in DEVICE_AWARE:
            command += ["--device", cli.device]
        if subprocess.run(command, check=False).returncode != 0:
            failed.append(name)
    print(f"\n# done — {machine_line()}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
