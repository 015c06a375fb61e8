"""Where a hint puts the answer within reach, and where unhinted answers go wrong (docs/hints.md).

Per level of the chain task's held-out problems (the first `--per-level` of each), for the shipped model and LoRA
adapters: greedy accuracy when the answer starts from the first k clauses of the worked solution (k = 0 .. level - 1,
written after the chat prompt's generation prompt, as hint-guided rollouts write it; right when hint + completion ends
in the answer), and the clause at which an unhinted greedy answer first goes wrong (`tasks.chain.leading_steps`:
clause 1 .. level, or none). Adapters are merged into the base (`pass_at_k.load_model`); runs named NAME-sSEED are
also averaged over seeds, as NAME.

    python -m benchmarks.accuracy.hint_reach [--adapter NAME=DIR ...] [--levels 3 4] [--per-level 500] [--json OUT]
    python -m benchmarks.accuracy.hint_reach --quick     # smoke run: base, 4 problems per level (numbers are noise)

Greedy decoding, one thread: the figures do not depend on the seed or the machine's load.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.accuracy.pass_at_k import MAIN_JOB, SEED_SUFFIX, load_model
from grpo_hub.algos.hints import hint_text
from grpo_hub.tasks import chain
from grpo_hub.tasks.arithmetic import chat_prompt, generate_texts, parse_answer


def level_report(model, tokenizer, problems: list, batch: int) -> dict:
    """{"hinted": [accuracy with a hint of k clauses, k = 0 .. level - 1], "first_wrong": {clause or "none": share}}
    for problems of one level."""
    level, n = problems[0].level, len(problems)
    chat = [tokenizer.apply_chat_template(chat_prompt(p.question), tokenize=False, add_generation_prompt=True)
            for p in problems]  # fmt: skip
    hinted, first_wrong = [], {}
    for k in range(level):
        hints = [hint_text(p.solution.split(","), k, ",") for p in problems]
        prompts = [c + h for c, h in zip(chat, hints, strict=True)]  # the hint starts the assistant's answer
        completions = generate_texts(
            model, tokenizer, prompts, MAIN_JOB["max_completion_length"], batch, do_sample=False
        )
        answers = [
            h + c for h, c in zip(hints, completions, strict=True)
        ]  # the whole answer, as rewards see it
        right = [parse_answer(a) == p.answer for a, p in zip(answers, problems, strict=True)]
        hinted.append(round(sum(right) / n, 4))
        if k == 0:
            reached = [chain.leading_steps(a, p.solution) for a, p in zip(answers, problems, strict=True)]
            first_wrong = {str(c + 1): round(reached.count(c) / n, 4) for c in range(level)}
            first_wrong["none"] = round(reached.count(level) / n, 4)
    return {"hinted": hinted, "first_wrong": first_wrong}


def mean_reports(reports: list[dict]) -> dict:
    """The mean over seeds of `level_report`s, figure by figure."""
    return {
        "hinted": [round(statistics.fmean(r["hinted"][k] for r in reports), 4) for k in range(len(reports[0]["hinted"]))],
        "first_wrong": {c: round(statistics.fmean(r["first_wrong"][c] for r in reports), 4) for c in reports[0]["first_wrong"]},
    }  # fmt: skip


def print_report(models: dict) -> None:
    levels = sorted({level for report in models.values() for level in report}, key=int)
    for level in levels:
        n = int(level)
        print(
            f"\nlevel {level}: greedy accuracy with a hint of k clauses; the clause an unhinted answer first gets wrong\n"
        )
        print("| model | " + " | ".join(f"k={k}" for k in range(n)) + " | " + " | ".join(f"wrong at {c}" for c in range(1, n + 1)) + " | all right |")  # fmt: skip
        print("|---|" + "---:|" * (2 * n + 1))
        for name, report in models.items():
            row = report[level]
            cells = [f"{v:.3f}" for v in row["hinted"]] + [f"{row['first_wrong'][c]:.2f}" for c in [*map(str, range(1, n + 1)), "none"]]  # fmt: skip
            print(f"| {name} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", action="append", default=[], help="NAME=DIR of a trained LoRA adapter")
    parser.add_argument("--no-base", action="store_true", help="leave the shipped model out")
    parser.add_argument("--levels", nargs="+", type=int, default=list(chain.LEVELS))
    parser.add_argument("--per-level", type=int, default=chain.HELDOUT_PER_LEVEL)
    parser.add_argument("--batch", type=int, default=250)
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="smoke run: base, 4 problems per level")
    cli = parser.parse_args(argv)
    torch.set_num_threads(1)
    per_level = 4 if cli.quick else cli.per_level
    problems = chain.split_problems("heldout", per_level)
    runs = ([] if cli.no_base else [("base", None)]) + [tuple(a.split("=", 1)) for a in cli.adapter]
    models = {}
    for name, adapter in runs:
        model, tokenizer = load_model(adapter)
        models[name] = {
            str(level): level_report(model, tokenizer, [p for p in problems if p.level == level], cli.batch)
            for level in cli.levels
        }
        print(f"{name}: done", file=sys.stderr, flush=True)
    seeded = {}
    for name, report in models.items():
        if SEED_SUFFIX.search(name):
            seeded.setdefault(SEED_SUFFIX.sub("", name), []).append(report)
    for name, reports in seeded.items():
        models[name] = {level: mean_reports([r[level] for r in reports]) for level in reports[0]}
    print_report(models)
    if cli.json:
        Path(cli.json).write_text(json.dumps({"per_level": per_level, "models": models}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
