"""GRPO on gymnasium CartPole-v1 (or another discrete-action env) with grpo_hub's advantage variants.

    python recipes/cartpole.py --variant process_rtg                    # one run, seed 0
    nice -n 10 python recipes/cartpole.py --variant outcome process process_rtg --seed 0 1 2 \\
        --max-env-steps 200000 --out outputs/cartpole-sweep --plot          # the README table

Every `GymGRPOConfig` field is a flag (`--group-size 8`, `--lr 3e-3`, ...). Each run writes
`<out>/<variant>-seed<k>/{progress.csv,summary.json,policy.pt}`; the results table is printed and written to
`<out>/results.md`, and `--plot` draws `<out>/returns.png` when matplotlib is installed.
"""

import argparse
import os
import statistics
from dataclasses import fields
from pathlib import Path

import torch

from grpo_hub.tasks.gym import VARIANTS, GymGRPOConfig, plot_returns, train


def parse_args(argv=None) -> argparse.Namespace:
    """Flags from the GymGRPOConfig fields; --variant and --seed accept several values (a sweep)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", nargs="+", choices=VARIANTS, default=["process_rtg"])
    parser.add_argument("--seed", nargs="+", type=int, default=[0])
    for f in fields(GymGRPOConfig):
        if f.name not in ("variant", "seed"):
            parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    parser.add_argument("--out", default="outputs/cartpole", help="folder for logs, results.md, returns.png")
    parser.add_argument("--plot", action="store_true", help="draw returns.png (needs matplotlib)")
    parser.add_argument("--no-progress", action="store_true", help="hide the tqdm bar")
    return parser.parse_args(argv)


def results_table(summaries: list[dict]) -> str:
    """Markdown: one row per run, then the median steps-to-solve of each variant."""
    lines = [
        "| variant | seed | solved | env steps to solve | env steps run | wall s | greedy eval | sampled eval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        c = s["config"]
        lines.append(
            f"| {c['variant']} | {c['seed']} | {'yes' if s['solved'] else 'no'} | {s['solved_env_steps'] or '-'} "
            f"| {s['env_steps']} | {s['wall_s']:.1f} | {s['final_eval_return']:.1f} | {s['final_sampled_return']:.1f} |"
        )
    for variant in dict.fromkeys(s["config"]["variant"] for s in summaries):
        runs = [s for s in summaries if s["config"]["variant"] == variant]
        solved = [s["solved_env_steps"] for s in runs if s["solved"]]
        median = f"median {statistics.median(solved):.0f} env steps" if solved else "no run solved"
        lines.append(f"\n**{variant}**: solved {len(solved)}/{len(runs)}, {median}")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    """Run every (variant, seed) one after the other; return the summaries."""
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    options = {
        f.name: getattr(args, f.name) for f in fields(GymGRPOConfig) if f.name not in ("variant", "seed")
    }
    out, summaries, histories = Path(args.out), [], {}
    for variant in args.variant:
        for seed in args.seed:
            cfg = GymGRPOConfig(variant=variant, seed=seed, **options)
            result = train(cfg, log_dir=out / f"{variant}-seed{seed}", progress=not args.no_progress)
            histories[f"{variant} seed {seed}"] = result.pop("history")
            result.pop("policy")
            summaries.append(result)
            print(
                f"{variant} seed {seed}: solved={result['solved']} at {result['solved_env_steps']} env steps, "
                f"{result['env_steps']} run, {result['wall_s']:.1f} s, eval {result['final_eval_return']:.1f}"
            )
    table = results_table(summaries)
    (out / "results.md").write_text(table + "\n")
    print(table)
    if args.plot and not plot_returns(histories, out / "returns.png"):
        print("--plot: matplotlib is not installed (pip install matplotlib); no plot written")
    return summaries


if __name__ == "__main__":
    main()
