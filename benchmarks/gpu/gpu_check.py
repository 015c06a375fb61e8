"""GPU check in minutes: the GRPO recipe under every accelerate config with one process, default and ref-refresh.

For each of `single`, `zero2`, `zero3`, `fsdp2` (recipes/accelerate/<name>.yaml, `--num_processes 1`) and each
recipe config (recipes/configs/grpo.yaml, ref-refresh.yaml), run

    accelerate launch --config_file recipes/accelerate/<name>.yaml --num_processes 1 recipes/grpo.py \\
        --config recipes/configs/<recipe>.yaml --max_steps N --output_dir <tmp>/<name>-<recipe>

and print one Markdown table: exit status, and the mean reward of the first and last logged steps (from the
recipe's run_summary.json). FSDP with the reference adapter is refused by design (exit 1 expected, marked).

    python -m benchmarks.gpu.gpu_check             # one CUDA GPU, 30 steps each (~1-2 min per run)
    python -m benchmarks.gpu.gpu_check --jobs 4    # 4 runs at a time (each on its own port; exits, rewards only)
    python -m benchmarks.gpu.gpu_check --cpu       # on CPU (use_cpu, fp32; cpu-zero* configs; no fsdp2)
    python -m benchmarks.gpu.gpu_check --dry-run   # print the commands only
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grpo_hub.records.run_record import RUN_SUMMARY

REPO = Path(__file__).resolve().parents[2]
ACCELERATE_CONFIGS = ("single", "zero2", "zero3", "fsdp2")
RECIPES = ("grpo", "ref-refresh")
CPU_CONFIG = {"zero2": "cpu-zero2", "zero3": "cpu-zero3"}  # DeepSpeed on CPU needs the CPU variants
REFUSED = {("fsdp2", "ref-refresh"): "refused by design: FSDP + reference adapter"}
# With use_cpu the fsdp2 config trains exactly like `single` (same rewards, ref-refresh not refused): FSDP is
# not active on CPU, so --cpu leaves it out.
CPU_CONFIGS = ("single", "zero2", "zero3")
# The line naming why a run failed: the child's exception, not the launcher's ChildFailedError that follows it.
CAUSE = re.compile(
    r"^(?:\[rank\d+\]: )?(?:[\w.]+\.)?(?!ChildFailedError)\w*(?:Error|Exception|Interrupt)\b.*$"
)
FIRST_PORT = 29500  # accelerate's default main process port; run i of a --jobs batch takes FIRST_PORT + i


def command(
    config: str, recipe: str, output_dir: Path, steps: int, cpu: bool, port: int = FIRST_PORT
) -> list[str]:
    """The `accelerate launch` command of one run (its rendezvous on `port`: runs at once need their own)."""
    config_file = (
        REPO / "recipes" / "accelerate" / f"{CPU_CONFIG.get(config, config) if cpu else config}.yaml"
    )
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(config_file), "--num_processes", "1", "--main_process_port", str(port),
        str(REPO / "recipes" / "grpo.py"),
        "--config", str(REPO / "recipes" / "configs" / f"{recipe}.yaml"),
        "--max_steps", str(steps), "--logging_steps", "1", "--output_dir", str(output_dir),
    ]  # fmt: skip
    if cpu:
        cmd += ["--use_cpu", "true", "--bf16", "false"]
    return cmd


def failure_cause(output: str) -> str:
    """The last exception line a run printed (the child's, under accelerate's `[rankN]: ` prefix), else its tail."""
    causes = [line for line in output.splitlines() if CAUSE.match(line.strip())]
    return causes[-1].strip() if causes else " ".join(output.split())[-200:]


def run_one(cmd: list[str], output_dir: Path, timeout: float, log: Path | None = None) -> dict:
    """Run one command; {exit, reward_first, reward_last, seconds, cause} (rewards None when no summary; cause: why it
    failed, from `failure_cause`). `log`: where its whole output goes too."""
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        done = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code, output = "timeout", str(expired.stdout or "")
    if log is not None:
        log.write_text(output)
    summary_path = output_dir / RUN_SUMMARY  # written by recipes/grpo.py
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return {
        "exit": code,
        "reward_first": summary.get("reward_first"),
        "reward_last": summary.get("reward_last"),
        "seconds": time.perf_counter() - start,
        "cause": failure_cause(output) if code != 0 else "",
    }


def table(results: dict[tuple[str, str], dict]) -> str:
    """Markdown table of the runs: config, recipe, exit status, reward first -> last, seconds, note."""
    lines = [
        "| accelerate config | recipe | exit | reward first -> last | seconds | note |",
        "|---|---|---:|---|---:|---|",
    ]
    for (config, recipe), result in results.items():
        first, last = result["reward_first"], result["reward_last"]
        reward = f"{first:.3f} -> {last:.3f}" if first is not None and last is not None else "-"
        note = REFUSED.get((config, recipe), "")
        if note and result["exit"] == 0:
            note = "UNEXPECTED: ran although " + note
        elif not note and result["exit"] != 0:
            note = "FAILED: " + result["cause"]
        lines.append(
            f"| {config} | {recipe} | {result['exit']} | {reward} | {result['seconds']:.0f} | {note} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU (use_cpu, fp32, cpu-zero* configs)")
    parser.add_argument("--steps", type=int, help="optimizer steps per run (default 30 on GPU, 3 with --cpu)")
    parser.add_argument(
        "--configs", nargs="+", choices=ACCELERATE_CONFIGS, help="default: all (--cpu: no fsdp2)"
    )
    parser.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (their timings are then shared)")
    parser.add_argument(
        "--logs", type=Path, help="write each run's whole output here, as <config>-<recipe>.log"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    cli = parser.parse_args(argv)
    steps = cli.steps or (3 if cli.cpu else 30)
    configs = cli.configs or (CPU_CONFIGS if cli.cpu else ACCELERATE_CONFIGS)
    if not cli.cpu and not cli.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA GPU visible to torch: run with --cpu, or on a machine with a GPU.")
    keys = [(config, recipe) for config in configs for recipe in cli.recipes]
    with tempfile.TemporaryDirectory(prefix="grpo_hub_gpu_check_") as tmp:
        runs = {}
        for i, (config, recipe) in enumerate(keys):
            output_dir = Path(tmp) / f"{config}-{recipe}"
            runs[(config, recipe)] = (
                command(config, recipe, output_dir, steps, cli.cpu, FIRST_PORT + i),
                output_dir,
            )
            print(" ".join(runs[(config, recipe)][0]), flush=True)
        if cli.dry_run:
            return 0
        if cli.logs:
            cli.logs.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=cli.jobs) as pool:
            futures = {
                key: pool.submit(
                    run_one, cmd, out, cli.timeout, cli.logs and cli.logs / f"{key[0]}-{key[1]}.log"
                )
                for key, (cmd, out) in runs.items()
            }
            results = {key: future.result() for key, future in futures.items()}
    print(table(results))
    unexpected = [key for key, r in results.items() if (r["exit"] == 0) == (key in REFUSED)]
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
