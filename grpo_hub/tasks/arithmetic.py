"""Built-in task "arithmetic": integer arithmetic with graded difficulty, verifiable answers, held-out splits.

```python
from grpo_hub.tasks.arithmetic import load_arithmetic, evaluate
train = load_arithmetic("train", n=512, seed=0)   # Dataset: prompt (chat messages), answer, level
report = evaluate(model, tokenizer, "heldout")    # held-out accuracy per level, greedy (+ pass@k)
```

A problem is `a<op>b=` where `a` has `level` digits (1-4), `b` is one digit and op is in + - *, so a
level is how far a carry or borrow may travel (and how long a product runs): a tiny model learns every
level partly, which is where GRPO has signal; `n_ops=2` chains a second op with another one-digit
operand (`a+b*c=` is computed left to right: no precedence). The prompt is one user message holding the problem; the answer is the plain
integer. The task's model (`arithmetic_model`) carries `CHAT_TEMPLATE`: "<|im_start|>u12+7=<|im_end|><|im_start|>a".
Rewards: `arithmetic_correctness_reward` (1 if the completion's last integer equals the answer)
and `arithmetic_format_reward` (0.1 if the completion is one bare integer). math_verify is not used: the
answers are exact integers, which a regex and string comparison check exactly (any length, no float
tolerance, no parsing cost).

Splits: "heldout" is `HELDOUT_PER_LEVEL` distinct problems per level, one fixed set whatever the seed;
"train" draws from the stream of its `seed` and skips every held-out problem, so the two never overlap.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from grpo_hub.tasks.text import completion_text

CHAT_TEMPLATE = (  # compact: the role's initial only, so a prompt is ~10 tokens and SFT/GRPO steps stay cheap
    "{% for message in messages %}<|im_start|>{{ message['role'][0] }}{{ message['content'] }}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>a{% endif %}"
)
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
    """A random problem: a `level`-digit number and `n_ops` (op, one-digit operand) pairs, left to right."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if n_ops < 1:
        raise ValueError(f"n_ops must be >= 1, got {n_ops!r}")
    value = _operand(rng, level)
    question = str(value)
    for _ in range(n_ops):
        op = rng.choice(OPS)
        operand = _operand(rng, 1)
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


def heldout_problems(n_ops: int = 1) -> list[Problem]:
    """The fixed held-out set of `n_ops`-op problems (one set, whatever the training seed): `HELDOUT_PER_LEVEL`
    distinct problems per level, ordered by level."""
    return _draw_distinct(f"arithmetic-heldout-0-{n_ops}", HELDOUT_PER_LEVEL, LEVELS, n_ops)


def train_problems(n: int, seed: int = 0, n_ops: int = 1, levels: Sequence[int] = LEVELS) -> list[Problem]:
    """`n` training problems (levels in turn, shuffled) from the stream of `seed`, never a held-out problem."""
    heldout = {p.question for p in heldout_problems(n_ops)}
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


def chat_text(question: str) -> str:
    """The prompt as the model reads it: `chat_prompt(question)` rendered with `CHAT_TEMPLATE`."""
    import jinja2

    template = jinja2.Environment(autoescape=False).from_string(CHAT_TEMPLATE)
    return template.render(messages=chat_prompt(question), add_generation_prompt=True)


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
    """Problems of `split`: "train" -> `n` problems of `seed`'s stream, "heldout" -> the first `n`
    (<= HELDOUT_PER_LEVEL) per level of the fixed held-out set (`seed` does not apply)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "train":
        return train_problems(n, seed, n_ops)
    if not 1 <= n <= HELDOUT_PER_LEVEL:
        raise ValueError(
            f"the held-out split has {HELDOUT_PER_LEVEL} problems per level; n={n!r} is outside that"
        )
    return [p for i, p in enumerate(heldout_problems(n_ops)) if i % HELDOUT_PER_LEVEL < n]


def parse_answer(text: str) -> str | None:
    """The last integer written in `text`, normalised ("-007" -> "-7", "-0" -> "0"); None if there is none.

    Kept as text, so integers of any length compare exactly (Python's int() refuses > 4300 digits).
    """
    found = _INTEGER.findall(text)
    if not found:
        return None
    digits = found[-1].lstrip("-").lstrip("0") or "0"
    return "-" + digits if found[-1].startswith("-") and digits != "0" else digits


def final_integer_rewards(completions, answer) -> list[float]:
    """1.0 when a completion's last integer equals its row's `answer`, else 0.0 (no integer: 0.0)."""
    return [
        float(parse_answer(completion_text(c)) == parse_answer(str(gold)))
        for c, gold in zip(completions, answer, strict=True)
    ]


def arithmetic_correctness_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion's last integer equals the row's `answer`, else 0.0 (no integer: 0.0)."""
    return final_integer_rewards(completions, answer)


def arithmetic_format_reward(prompts, completions, **kwargs) -> list[float]:
    """`FORMAT_REWARD` when the completion is one bare integer (surrounding whitespace allowed), else 0.0."""
    return [FORMAT_REWARD * bool(_BARE_INTEGER.fullmatch(completion_text(c))) for c in completions]


def generate_answers(
    model,
    tokenizer,
    questions: Sequence[str],
    max_new_tokens: int,
    batch_size: int,
    k: int = 0,
    temperature=1.0,
) -> list[str]:
    """Completions of every question (as a chat prompt): greedy when k == 0, else k samples each (question-major)."""
    texts = [
        tokenizer.apply_chat_template(chat_prompt(question), tokenize=False, add_generation_prompt=True)
        for question in questions
    ]
    options = {"do_sample": False} if k == 0 else {"do_sample": True, "temperature": temperature}
    return generate_texts(
        model, tokenizer, texts, max_new_tokens, batch_size, num_return_sequences=max(k, 1), **options
    )


def generate_texts(
    model, tokenizer, texts: Sequence[str], max_new_tokens: int, batch_size: int, **options
) -> list[str]:
    """The decoded completions of already-rendered prompt `texts`, `batch_size` prompts per left-padded `generate`
    (`options`: generate's sampling options, e.g. do_sample, temperature, num_return_sequences)."""
    import torch

    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    outputs = []
    try:
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(list(texts[start : start + batch_size]), return_tensors="pt", padding=True)
            batch = batch.to(model.device)
            with torch.inference_mode():
                ids = model.generate(
                    **batch, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id, **options,
                )  # fmt: skip
            outputs += tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return outputs


def evaluate(
    model,
    tokenizer,
    split: str = "heldout",
    *,
    n: int = HELDOUT_PER_LEVEL,
    seed: int = 0,
    pass_k: int = 0,
    temperature: float = 1.0,
    sample_seed: int = 0,
    max_new_tokens: int = 8,
    batch_size: int = 64,
) -> dict:
    """Accuracy per level on `split` (`n` problems per level for "heldout", `n` in all for "train").

    Returns {"greedy": {level: acc, ..., "all": mean over problems}} and, with `pass_k` > 0,
    "pass@k" (share of problems with at least one right answer among `pass_k` samples at `temperature`,
    seeded with `sample_seed`) and "sampled" (share of right samples). The model is put in eval mode.
    """
    problems = split_problems(split, n, seed)
    return score_problems(
        model, tokenizer, problems, max_new_tokens, batch_size, pass_k, temperature, sample_seed
    )


def score_problems(
    model, tokenizer, problems, max_new_tokens: int, batch_size: int, pass_k=0, temperature=1.0, sample_seed=0
) -> dict:
    """`evaluate`'s report for any problems with `question`, `answer` and `level` (the chain task's too): the
    final integer of each greedy completion (and of `pass_k` samples) checked against the answer."""
    import torch

    model.eval()
    questions = [p.question for p in problems]
    greedy = generate_answers(model, tokenizer, questions, max_new_tokens, batch_size)
    right = {"greedy": [parse_answer(text) == p.answer for text, p in zip(greedy, problems, strict=True)]}
    if pass_k > 0:
        torch.manual_seed(sample_seed)
        samples = generate_answers(
            model, tokenizer, questions, max_new_tokens, batch_size, pass_k, temperature
        )
        hits = [parse_answer(text) == problems[i // pass_k].answer for i, text in enumerate(samples)]
        per_problem = [hits[i * pass_k : (i + 1) * pass_k] for i in range(len(problems))]
        right[f"pass@{pass_k}"] = [any(h) for h in per_problem]
        right["sampled"] = [sum(h) / pass_k for h in per_problem]
    return {name: accuracy_by_level(values, problems) for name, values in right.items()}


def accuracy_by_level(scores: Sequence[float], problems: Sequence[Problem]) -> dict:
    """Mean score per level present in `problems`, plus "all" (mean over every problem), rounded to 4 places."""
    report = {}
    for level in sorted({p.level for p in problems}):
        values = [float(s) for s, p in zip(scores, problems, strict=True) if p.level == level]
        report[str(level)] = round(sum(values) / len(values), 4)
    report["all"] = round(sum(map(float, scores)) / len(scores), 4)
    return report
