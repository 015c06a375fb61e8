"""Built-in task "arithmetic": integer arithmetic with graded difficulty, verifiable answers, held-out splits.

```python
from grpo_hub.tasks.arithmetic import load_arithmetic, evaluate
train = load_arithmetic("train", n=512, seed=0)   # Dataset: prompt (chat messages), answer, level
report = evaluate(model, tokenizer, "heldout")    # held-out accuracy per level, greedy (+ pass@k)
```

A problem is `a<op>b=` with operands of `level` digits (1-4) and op in + - *; a product takes a one-digit
second factor so that every level stays learnable; `n_ops=2` chains a second op (`a+b*c=` is computed left
to right: no precedence). The prompt is one user message holding the problem; the answer is the plain
integer. Rewards: `arithmetic_correctness_reward` (1 if the completion's last integer equals the answer)
and `arithmetic_format_reward` (0.1 if the completion is one bare integer). math_verify is not used: the
answers are exact integers, which a regex and string comparison check exactly (any length, no float
tolerance, no parsing cost).

Splits: "heldout" is `HELDOUT_PER_LEVEL` distinct problems per level drawn from its own seed stream;
"train" draws from another stream and skips every held-out problem, so the two never overlap.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from grpo_hub.tasks.text import completion_text

LEVELS = (1, 2, 3, 4)
OPS = "+-*"
SPLITS = ("train", "heldout")
HELDOUT_PER_LEVEL = 50
FORMAT_REWARD = 0.1
_INTEGER = re.compile(r"(?:(?<!\w)-)?\d+")  # a "-" after a digit or letter is an operator
_BARE_INTEGER = re.compile(r"\s*-?\d+\s*")


@dataclass(frozen=True)
class Problem:
    """One problem: `question` is what the user writes ("12+7="), `answer` the exact integer as text."""

    question: str
    answer: str
    level: int


def _operand(rng: random.Random, digits: int) -> int:
    """A non-negative integer with exactly `digits` digits (0-9 for one digit)."""
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def make_problem(rng: random.Random, level: int, n_ops: int = 1) -> Problem:
    """A random problem of `level` (operand digits) with `n_ops` operators, evaluated left to right."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if n_ops < 1:
        raise ValueError(f"n_ops must be >= 1, got {n_ops!r}")
    value = _operand(rng, level)
    question = str(value)
    for _ in range(n_ops):
        op = rng.choice(OPS)
        operand = _operand(rng, 1 if op == "*" else level)
        value = {"+": value + operand, "-": value - operand, "*": value * operand}[op]
        question += f"{op}{operand}"
    return Problem(question + "=", str(value), level)


def _draw_distinct(stream: str, per_level: int, levels: Sequence[int], n_ops: int, skip=frozenset()):
    """`per_level` distinct problems per level from the seed stream `stream`, none of whose questions is in `skip`."""
    rng = random.Random(stream)
    problems = []
    for level in levels:
        seen = set(skip)
        for _ in range(per_level):
            for _attempt in range(10_000):
                problem = make_problem(rng, level, n_ops)
                if problem.question not in seen:
                    break
            else:
                raise ValueError(f"level {level} has too few distinct problems for {per_level} per level")
            seen.add(problem.question)
            problems.append(problem)
    return problems


def heldout_problems(seed: int = 0, n_ops: int = 1) -> list[Problem]:
    """The fixed held-out set: `HELDOUT_PER_LEVEL` distinct problems per level, ordered by level."""
    return _draw_distinct(f"arithmetic-heldout-{seed}-{n_ops}", HELDOUT_PER_LEVEL, LEVELS, n_ops)


def train_problems(n: int, seed: int = 0, n_ops: int = 1, levels: Sequence[int] = LEVELS) -> list[Problem]:
    """`n` training problems (levels in turn, shuffled), never one of the held-out set of the same seed."""
    heldout = {p.question for p in heldout_problems(seed, n_ops)}
    rng = random.Random(f"arithmetic-train-{seed}-{n_ops}")
    problems = []
    while len(problems) < n:
        problem = make_problem(rng, levels[len(problems) % len(levels)], n_ops)
        if problem.question not in heldout:
            problems.append(problem)
    rng.shuffle(problems)
    return problems


def chat_prompt(question: str) -> list[dict]:
    """The conversational prompt TRL and the chat template expect: one user message."""
    return [{"role": "user", "content": question}]


def load_arithmetic(split: str = "train", n: int = 512, seed: int = 0, n_ops: int = 1):
    """`datasets.Dataset` with columns prompt (chat messages), answer (integer as text), level.

    "train": `n` problems; "heldout": the first `n` of each level's fixed held-out problems.
    """
    from datasets import Dataset

    problems = split_problems(split, n, seed, n_ops)
    return Dataset.from_list(
        [{"prompt": chat_prompt(p.question), "answer": p.answer, "level": p.level} for p in problems]
    )


def split_problems(split: str, n: int, seed: int = 0, n_ops: int = 1) -> list[Problem]:
    """Problems of `split`: "train" -> `n` problems, "heldout" -> the first `n` (<= HELDOUT_PER_LEVEL) per level."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "train":
        return train_problems(n, seed, n_ops)
    if not 1 <= n <= HELDOUT_PER_LEVEL:
        raise ValueError(
            f"the held-out split has {HELDOUT_PER_LEVEL} problems per level; n={n!r} is outside that"
        )
    return [p for i, p in enumerate(heldout_problems(seed, n_ops)) if i % HELDOUT_PER_LEVEL < n]


def parse_answer(text: str) -> str | None:
    """The last integer written in `text`, normalised ("-007" -> "-7", "-0" -> "0"); None if there is none.

    Kept as text, so integers of any length compare exactly (Python's int() refuses > 4300 digits).
    """
    found = _INTEGER.findall(text)
    if not found:
        return None
    digits = found[-1].lstrip("-").lstrip("0") or "0"
    return "-" + digits if found[-1].startswith("-") and digits != "0" else digits


def arithmetic_correctness_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion's last integer equals the row's `answer`, else 0.0 (no integer: 0.0)."""
    return [
        float(parse_answer(completion_text(c)) == parse_answer(str(gold)))
        for c, gold in zip(completions, answer, strict=True)
    ]


def arithmetic_format_reward(prompts, completions, **kwargs) -> list[float]:
    """`FORMAT_REWARD` when the completion is one bare integer (surrounding whitespace allowed), else 0.0."""
    return [FORMAT_REWARD * bool(_BARE_INTEGER.fullmatch(completion_text(c))) for c in completions]
