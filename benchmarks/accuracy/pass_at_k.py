"""Where the ceiling is: pass@k per level of the chain task's held-out problems, for the shipped model and LoRA adapters.

Per model, `--samples` (64) completions of each of the first `--per-level` (60) held-out problems of every level
(`grpo_hub.tasks.chain.split_problems("heldout", N)`), sampled as the main job samples them (recipes/configs/chain.yaml:
its temperature and `max_completion_length`, TRL's top_k=0 and top_p=1, the chat prompt TRL renders) and scored with
`chain_correctness_reward`. From each problem's count of right samples, per level (`grpo_hub.algos.pass_at_k`, the
unbiased estimators of Chen et al. 2021, arXiv:2107.03374): pass@k for k in `KS`; the share of problems with no right
answer in all the samples; the chance that a group of `GROUP` (the main job's `num_generations`) holds both outcomes
(a non-zero gradient); pass@b for each rollout budget b in `BUDGETS` (the share of groups of b that see a right answer),
and the smallest budget at which a level's groups see one half the time. Adapters are merged into the base
(`chain_model.chain_model_path()`); runs named NAME-sSEED are also averaged over seeds, as NAME.

    python -m benchmarks.accuracy.pass_at_k [--adapter NAME=DIR ...] [--no-base] [--json OUT]
    python -m benchmarks.accuracy.pass_at_k --merge A.json B.json ... --json OUT   # one report from several runs
    python -m benchmarks.accuracy.pass_at_k --quick   # smoke run: base, 2 problems per level, 8 samples (noise)

Sampling is seeded (`--seed`, reset for each model), single-threaded; the figures depend on `--batch` as well, since
the random stream is shared by the rows of a batch.
"""

import argparse
import datetime
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from grpo_hub.algos.pass_at_k import both_outcomes_in_group, pass_at_k
from grpo_hub.config.config_files import read_config
from grpo_hub.tasks import chain
from grpo_hub.tasks.arithmetic import chat_prompt, generate_texts

KS = (1, 8, 16, 32, 64)
BUDGETS = (2, 4, 8, 16, 32, 64)
MAIN_JOB = read_config(Path(__file__).resolve().parents[2] / "recipes" / "configs" / "chain.yaml")
GROUP = MAIN_JOB["num_generations"]
SEED_SUFFIX = re.compile(r"-s\d+$")


def load_model(adapter: str | None):
    """The shipped chain model in eval mode, with the PEFT adapter in folder `adapter` merged in (None: the base)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_hub.tasks.chain_model import chain_model_path

    base = chain_model_path()
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model.eval(), AutoTokenizer.from_pretrained(base)


def right_counts(
    model, tokenizer, problems, samples: int, seed: int, batch: int, top_k: int = 0
) -> list[int]:
    """Number of right answers among `samples` completions of each problem, `batch` problems per `generate`
    (`top_k` 0: no top-k filter, as TRL samples; transformers' own default is 50)."""
    texts = [
        tokenizer.apply_chat_template(chat_prompt(p.question), tokenize=False, add_generation_prompt=True)
        for p in problems
    ]
    torch.manual_seed(seed)
    completions = generate_texts(
        model, tokenizer, texts, MAIN_JOB["max_completion_length"], batch, do_sample=True,
        temperature=MAIN_JOB["temperature"], top_k=top_k, top_p=1.0, num_return_sequences=samples,
    )  # fmt: skip
    answers = [p.answer for p in problems for _ in range(samples)]
    rewards = chain.chain_correctness_reward(None, completions, answers)
    return [int(sum(rewards[i : i + samples])) for i in range(0, len(rewards), samples)]


def half_budget(n: int, counts: list[int]) -> int | None:
    """Smallest budget b <= n at which the mean pass@b over `counts` reaches 0.5 (None: not within n)."""
    for b in range(1, n + 1):
        if statistics.fmean(pass_at_k(n, c, b) for c in counts) >= 0.5:
            return b
    return None


def level_figures(n: int, counts: list[int]) -> dict:
    """Means over one level's problems of each figure, from their right counts out of `n` samples."""

    def mean(function, k):
        return statistics.fmean(function(n, c, k) for c in counts)

    return {
        "pass": {str(k): mean(pass_at_k, k) for k in KS if k <= n},
        "no_right": statistics.fmean(c == 0 for c in counts),
        "both_outcomes": mean(both_outcomes_in_group, GROUP) if n >= GROUP else None,
        "budget_pass": {str(b): mean(pass_at_k, b) for b in BUDGETS if b <= n},
        "half_budget": half_budget(n, counts),
    }


def summarize(samples: int, counts: dict[str, list[int]]) -> dict:
    """`level_figures` per level ({level: counts}) and over every problem ("all")."""
    levels = {level: level_figures(samples, values) for level, values in counts.items()}
    levels["all"] = level_figures(samples, [c for values in counts.values() for c in values])
    return levels


def mean_figures(runs: list[dict]) -> dict:
    """The figures of several runs (same levels), averaged: every number is the mean over the runs; half_budget the
    smallest budget at which the runs' mean pass@b reaches 0.5, from their counts."""
    samples = runs[0]["samples"]
    merged = {}
    for level in runs[0]["levels"]:
        figures = [run["levels"][level] for run in runs]
        merged[level] = {
            "pass": {k: statistics.fmean(f["pass"][k] for f in figures) for k in figures[0]["pass"]},
            "no_right": statistics.fmean(f["no_right"] for f in figures),
            "both_outcomes": None
            if figures[0]["both_outcomes"] is None
            else statistics.fmean(f["both_outcomes"] for f in figures),
            "budget_pass": {
                b: statistics.fmean(f["budget_pass"][b] for f in figures) for b in figures[0]["budget_pass"]
            },
            "half_budget": half_budget(samples, _pooled(runs, level)),
        }
    return merged


def _pooled(runs: list[dict], level: str) -> list[int]:
    if level == "all":
        return [c for run in runs for values in run["counts"].values() for c in values]
    return [c for run in runs for c in run["counts"][level]]


def groups(models: dict) -> dict:
    """{NAME: its runs' mean figures} for every NAME with runs named NAME-sSEED (and the seeds it averages)."""
    by_name = {}
    for model, run in models.items():
        if SEED_SUFFIX.search(model):
            by_name.setdefault(SEED_SUFFIX.sub("", model), []).append((model, run))
    return {
        name: {"runs": [m for m, _ in runs], "levels": mean_figures([r for _, r in runs])}
        for name, runs in by_name.items()
    }


def print_levels(title: str, levels: dict, samples: int) -> None:
    from benchmarks.common import print_table

    def cell(value) -> str:
        return "-" if value is None else f"{value:.2f}"

    first = next(iter(levels.values()))
    print(f"\n{title}\n")
    header = ["level", *(f"pass@{k}" for k in first["pass"])]
    header += [f"a group of {GROUP} has both outcomes", f"no right answer in {samples}"]
    rows = [
        [level, *(cell(v) for v in f["pass"].values()), cell(f["both_outcomes"]), cell(f["no_right"])]
        for level, f in levels.items()
    ]
    print_table(header, rows)
    print(
        "\nA group of b completions sees a right answer (pass@b), and the budget b at which it does half the time:\n"
    )
    header = ["level", *(f"b={b}" for b in first["budget_pass"]), "b for 0.5"]
    rows = [
        [level, *(cell(v) for v in f["budget_pass"].values()), str(f["half_budget"] or f"> {samples}")]
        for level, f in levels.items()
    ]
    print_table(header, rows)


def print_report(result: dict) -> None:
    print(result["header"])
    for name, run in result["models"].items():
        print_levels(
            f"## {name} ({run['adapter'] or 'the shipped model'}; {run['seconds']:.0f} s)",
            run["levels"],
            run["samples"],
        )
    for name, group in result["groups"].items():
        samples = result["models"][group["runs"][0]]["samples"]
        print_levels(f"## {name}: mean over {', '.join(group['runs'])}", group["levels"], samples)


def measure(name: str, adapter: str | None, cli) -> dict:
    problems = chain.split_problems("heldout", cli.per_level)
    model, tokenizer = load_model(adapter)
    began = time.perf_counter()
    counts = right_counts(model, tokenizer, problems, cli.samples, cli.seed, cli.batch, cli.top_k)
    seconds = time.perf_counter() - began
    by_level = {}
    for problem, count in zip(problems, counts, strict=True):
        by_level.setdefault(str(problem.level), []).append(count)
    print(
        f"{name}: {len(problems)} problems x {cli.samples} samples in {seconds:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return {
        "adapter": adapter,
        "samples": cli.samples,
        "per_level": cli.per_level,
        "seed": cli.seed,
        "top_k": cli.top_k,
        "seconds": round(seconds, 1),
        "counts": by_level,
        "levels": summarize(cli.samples, by_level),
    }


def header_line(cli) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{now}; chain held-out, first {cli.per_level} problems per level, {cli.samples} samples each at temperature "
        f"{MAIN_JOB['temperature']}, <= {MAIN_JOB['max_completion_length']} new tokens, seed {cli.seed}, batch "
        f"{cli.batch} problems; torch {torch.__version__}, {torch.get_num_threads()} thread, python "
        f"{platform.python_version()}"
    )


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--adapter", action="append", default=[], metavar="NAME=DIR", help="a LoRA adapter folder"
    )
    parser.add_argument("--no-base", action="store_true", help="leave out the shipped model itself")
    parser.add_argument("--per-level", type=int, default=60)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=4, help="problems per generate call")
    parser.add_argument("--top-k", type=int, default=0, help="top-k filter (0: none, as TRL samples)")
    parser.add_argument(
        "--merge", nargs="+", metavar="JSON", help="report the runs of these files (no sampling)"
    )
    parser.add_argument("--json", metavar="OUT", help="write the counts and figures here")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: base, 2 problems per level, 8 samples"
    )
    cli = parser.parse_args(argv)
    if cli.quick:
        cli.per_level, cli.samples, cli.adapter, cli.no_base = 2, 8, [], False
    for spec in cli.adapter:
        if "=" not in spec:
            parser.error(f"--adapter takes NAME=DIR, got {spec!r}")
    return cli


def main(argv: list[str] | None = None) -> int:
    cli = parse(argv)
    torch.set_num_threads(1)
    if cli.merge:
        parts = [json.loads(Path(path).read_text()) for path in cli.merge]
        header = "\n".join(part["header"] for part in parts)
        models = {name: run for part in parts for name, run in part["models"].items()}
    else:
        header = header_line(cli)
        specs = ([] if cli.no_base else [("base", None)]) + [tuple(s.split("=", 1)) for s in cli.adapter]
        models = {name: measure(name, adapter, cli) for name, adapter in specs}
    result = {"header": header, "models": models, "groups": groups(models)}
    print_report(result)
    if cli.json:
        Path(cli.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
