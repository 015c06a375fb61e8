"""Built-in task "chain": multi-step arithmetic solved with a scratchpad, the default reasoning task.

```python
from grpo_hub.tasks.chain import load_chain, evaluate
train = load_chain("train", n=4096, seed=0)    # Dataset: prompt (chat messages), answer, level, solution
report = evaluate(model, tokenizer)            # held-out accuracy per level (2,000 problems), greedy
```

A problem is a two-digit start value followed by `level` steps (1-4), each an op in `+ - *` with a one-digit
operand, applied left to right: "37+5*3-4=". Every intermediate value stays in 0..999 (a step that would
leave that range is redrawn), so each step is a small sum, difference or product. The model answers with a
scratchpad, one step per clause (the step copied, then its result), and the last result is the answer:

    37+5*3-4=   ->   37+5=42,42*3=126,126-4=122

so a completion runs 5-40 tokens (one token per character) and errors compound along the chain: a level is
how many steps must all be right. `chain_correctness_reward` is 1.0 when the completion's last integer is the
answer (the task's reward: only correctness is rewarded, so a group is zero-signal exactly when all its answers
agree in rightness). `chain_step_reward`, which a run adds by name (the recipe's `reward_funcs`), gives partial
credit: the share of the worked solution's clauses the scratchpad gets right from the first. Splits: "heldout" is
`HELDOUT_PER_LEVEL` (500) distinct problems per level, 2,000 in all (standard error <= 1.1 points): one fixed set,
whatever the seed; "train" draws from the stream of its `seed` and skips every held-out problem, so no seed puts a
held-out problem into training. The model is `chain_model.chain_model_path()`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from grpo_hub.tasks.arithmetic import (
    CHAT_TEMPLATE,
    SPLITS,
    chat_prompt,
    final_integer_rewards,
    score_problems,
)
from grpo_hub.tasks.text import completion_text

__all__ = [
    "CHAT_TEMPLATE",
    "chain_correctness_reward",
    "chain_step_reward",
    "evaluate",
    "leading_steps",
    "load_chain",
    "make_problem",
]

LEVELS = (1, 2, 3, 4)
HELDOUT_PER_LEVEL = 500
MAX_VALUE = 999
MAX_COMPLETION_TOKENS = 48  # the longest scratchpad (4 clauses like "999-9=990", 3 commas) + EOS fits
OPS = "+-*"


@dataclass(frozen=True)
class ChainProblem:
    """One problem: `question` ("37+5*3="), the worked `solution` ("37+5=42,42*3=126"), its `answer` ("126")."""

    question: str
    solution: str
    answer: str
    level: int


def _apply(value: int, op: str, operand: int) -> int:
    return {"+": value + operand, "-": value - operand, "*": value * operand}[op]


def make_problem(rng: random.Random, level: int) -> ChainProblem:
    """A random problem of `level` steps whose every intermediate value lies in 0..`MAX_VALUE`."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    value = rng.randint(10, 99)
    question, steps = str(value), []
    for _ in range(level):
        while True:
            op, operand = rng.choice(OPS), rng.randint(1, 9)
            result = _apply(value, op, operand)
            if 0 <= result <= MAX_VALUE and not (op == "*" and operand == 1):
                break
        question += f"{op}{operand}"
        steps.append(f"{value}{op}{operand}={result}")
        value = result
    return ChainProblem(question + "=", ",".join(steps), str(value), level)


def _draw(stream: str, per_level: int, skip=frozenset()) -> list[ChainProblem]:
    """`per_level` distinct problems per level (in level order) from `stream`, none of whose questions is in `skip`."""
    rng = random.Random(stream)
    problems = []
    for level in LEVELS:
        seen, drawn = set(skip), []
        while len(drawn) < per_level:
            problem = make_problem(rng, level)
            if problem.question not in seen:
                seen.add(problem.question)
                drawn.append(problem)
        problems += drawn
    return problems


def heldout_problems() -> list[ChainProblem]:
    """The fixed held-out set: `HELDOUT_PER_LEVEL` distinct problems per level, ordered by level."""
    return _draw("chain-heldout-0", HELDOUT_PER_LEVEL)


def train_problems(n: int, seed: int = 0) -> list[ChainProblem]:
    """`n` problems (levels in turn, shuffled) from the stream of `seed`, never a held-out problem."""
    heldout = {p.question for p in heldout_problems()}
    rng = random.Random(f"chain-train-{seed}")
    problems = []
    while len(problems) < n:
        problem = make_problem(rng, LEVELS[len(problems) % len(LEVELS)])
        if problem.question not in heldout:
            problems.append(problem)
    rng.shuffle(problems)
    return problems


def split_problems(split: str, n: int, seed: int = 0) -> list[ChainProblem]:
    """ "train" -> `n` problems of `seed`'s stream; "heldout" -> the first `n` (<= `HELDOUT_PER_LEVEL`) problems of
    each level of the fixed held-out set (`seed` does not apply)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "train":
        return train_problems(n, seed)
    if not 1 <= n <= HELDOUT_PER_LEVEL:
        raise ValueError(
            f"the held-out split has {HELDOUT_PER_LEVEL} problems per level; n={n!r} is outside that"
        )
    return [p for i, p in enumerate(heldout_problems()) if i % HELDOUT_PER_LEVEL < n]


def load_chain(split: str = "train", n: int = 4096, seed: int = 0):
    """`datasets.Dataset` with columns prompt (chat messages), answer (integer as text), level, solution (the
    worked scratchpad, read by `chain_step_reward`)."""
    from datasets import Dataset

    return Dataset.from_list(
        [
            {"prompt": chat_prompt(p.question), "answer": p.answer, "level": p.level, "solution": p.solution}
            for p in split_problems(split, n, seed)
        ]
    )


def chain_correctness_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the scratchpad's last integer (its final result) equals the row's `answer`, else 0.0."""
    return final_integer_rewards(completions, answer)


def leading_steps(scratchpad: str, solution: str) -> int:
    """How many clauses of `solution` ("37+5=42,42*3=126") `scratchpad` writes, in order from the first, before its
    first wrong or missing one (clauses are split at commas; spaces around a clause are ignored)."""
    steps = 0
    for written, worked in zip(scratchpad.split(","), solution.split(","), strict=False):
        if written.strip() != worked:
            break
        steps += 1
    return steps


def chain_step_reward(prompts, completions, solution, hint=None, **kwargs) -> list[float]:
    """Partial credit per scratchpad step: the share of the row's worked `solution` the completion gets right from
    its first clause (`leading_steps` / the level), 0.0-1.0. A step-level (process) reward checked by rule against the
    worked solution, after the step supervision of Lightman et al. 2023 (arXiv:2305.20050): unlike the final answer,
    it tells apart the completions of a group that all end wrong. Under hint-guided rollouts (`hint`: the clauses a
    hint wrote in front of each completion, GRPOHubConfig.hint_column) the hint's clauses earn nothing."""
    hints = hint if hint is not None else [""] * len(completions)
    return [
        (leading_steps(completion_text(c), worked) - leading_steps(given, worked)) / len(worked.split(","))
        for c, worked, given in zip(completions, solution, hints, strict=True)
    ]


def evaluate(
    model,
    tokenizer,
    split: str = "heldout",
    *,
    n: int = HELDOUT_PER_LEVEL,
    seed: int = 0,
    batch_size: int = 500,
) -> dict:
    """Greedy accuracy per level on `split` ({"greedy": {"1": ..., "all": ...}}); puts the model in eval mode."""
    return score_problems(model, tokenizer, split_problems(split, n, seed), MAX_COMPLETION_TOKENS, batch_size)
