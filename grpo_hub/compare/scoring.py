"""Score and diff the columns of a comparison: built-in task rewards on free text, word-level diffs.

Rewards are the built-in task reward functions. Those that read a dataset column (the letter task's
`kind`, the chain and arithmetic tasks' `answer`) get it from the task's own prompt rows; for any other
prompt they are reported as missing. The prompts of the scored tasks (`grpo_hub.tasks.SCORED_TASKS`: chain, arithmetic)
are their held-out problems written out in the chat template, since the bank feeds the prompt text to the
model as it is; an answer to one of them is marked right or wrong (`correctness`), and its example button is
labelled by task, level and question (`example_label`).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from dataclasses import dataclass, field

from grpo_hub.compare.bank import CompareError, Limits, ModelBank, Sampling

_TRL_ARGS = {"prompts", "completions"}


def reward_functions() -> dict:
    """Built-in reward functions usable on free text, by name: those of the offline tasks."""
    from grpo_hub.tasks import OFFLINE_TASKS, get_reward_funcs

    return {fn.__name__: (task, fn) for task in OFFLINE_TASKS for fn in get_reward_funcs(task)}


@functools.lru_cache(maxsize=4)
def task_rows(task: str) -> dict[str, dict]:
    """The task's prompt rows by prompt text, to find the columns a reward reads: 512 rows at seed 0, or for
    a scored task its held-out problems (seed 0) in chat-template text (chain's template is arithmetic's)."""
    from grpo_hub.tasks import SCORED_TASKS, arithmetic, load_task_dataset

    if task in SCORED_TASKS:
        return {
            arithmetic.chat_text(p.question): {"answer": p.answer, "level": p.level, "question": p.question}
            for p in SCORED_TASKS[task].heldout_problems()
        }
    return {row["prompt"]: row for row in load_task_dataset(task, n=512, seed=0)}


def _first_of_each_level(task: str) -> list[str]:
    """The first held-out prompt of each level of a scored task, in level order."""
    first_of_level = {}
    for prompt, row in task_rows(task).items():
        first_of_level.setdefault(row["level"], prompt)
    return [first_of_level[level] for level in sorted(first_of_level)]


def example_prompts(per_task: int = 3) -> list[str]:
    """Prompts for the Space's examples: those of the scored tasks first (chain, then arithmetic; one per
    level), then `per_task` distinct prompts of each other offline task."""
    from grpo_hub.tasks import OFFLINE_TASKS, SCORED_TASKS

    scored = [prompt for task in SCORED_TASKS for prompt in _first_of_each_level(task)]
    others = [task for task in OFFLINE_TASKS if task not in SCORED_TASKS]
    return [*scored, *(p for task in others for p in list(task_rows(task))[:per_task])]


def scored_row(prompt: str) -> tuple[str | None, dict | None]:
    """(task, row) of the first scored task (chain, then arithmetic) holding `prompt` as a held-out problem, else
    (None, None)."""
    from grpo_hub.tasks import SCORED_TASKS

    for task in SCORED_TASKS:
        row = task_rows(task).get(prompt)
        if row is not None:
            return task, row
    return None, None


def example_label(prompt: str) -> str:
    """What the Space's example button shows: "<task> level <k>: <question>" for a scored task's held-out prompt
    (its chat-template text is what fills the prompt box), else the prompt itself."""
    task, row = scored_row(prompt)
    return f"{task} level {row['level']}: {row['question']}" if row else prompt


def correctness(prompt: str, completions: list[str]) -> list[bool] | None:
    """Right / wrong of each completion for a held-out prompt of a scored task; None for any other prompt.

    Right = the completion's last integer is the answer (the correctness reward of every scored task). A prompt
    held out by both tasks ("37+5=": chain level 1, arithmetic level 2) has one answer in both."""
    from grpo_hub.tasks.arithmetic import final_integer_rewards

    _, row = scored_row(prompt)
    if row is None:
        return None
    rewards = final_integer_rewards(completions, [row["answer"]] * len(completions))
    return [reward == 1.0 for reward in rewards]


def _needed_columns(fn) -> list[str]:
    """Dataset columns a TRL reward function requires besides prompts and completions."""
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.name not in _TRL_ARGS and p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty
    ]


def score(reward_names: list[str], prompt: str, completions: list[str]) -> dict[str, list[float] | None]:
    """Each named reward of each completion; None for a reward whose dataset column this prompt lacks."""
    available = reward_functions()
    unknown = [name for name in reward_names if name not in available]
    if unknown:
        raise CompareError(f"unknown reward function(s) {unknown}: choose from {sorted(available)}")
    scores = {}
    for name in reward_names:
        task, fn = available[name]
        row = task_rows(task).get(prompt, {})
        needed = _needed_columns(fn)
        if any(column not in row for column in needed):
            scores[name] = None
            continue
        columns = {column: [row[column]] * len(completions) for column in needed}
        scores[name] = [float(r) for r in fn([prompt] * len(completions), completions, **columns)]
    return scores


def diff_segments(base: str, other: str) -> list[tuple[str, str | None]]:
    """Word-level diff of `other` against `base`: (text, None | "+" added in other | "-" only in base)."""
    a, b = re.split(r"(\s+)", base), re.split(r"(\s+)", other)
    segments = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            segments.append(("".join(a[i1:i2]), None))
            continue
        if i2 > i1:
            segments.append(("".join(a[i1:i2]), "-"))
        if j2 > j1:
            segments.append(("".join(b[j1:j2]), "+"))
    return [(text, label) for text, label in segments if text]


@dataclass
class Column:
    """One model's completions, their rewards (per reward function), their diffs against the base, whether each
    is right for a held-out prompt of a scored task (`correctness`), and what is known of the model (`provenance`:
    commit, url, step, variant; see bank.provenance)."""

    label: str
    completions: list[str]
    rewards: dict[str, list[float] | None]
    diffs: list[list[tuple[str, str | None]]] | None = None
    correct: list[bool] | None = None
    provenance: dict = field(default_factory=dict)

    def mean_reward(self, name: str) -> float | None:
        """Mean of reward `name` over the completions, None if the reward could not be computed."""
        values = self.rewards.get(name)
        return sum(values) / len(values) if values else None


def compare(
    bank: ModelBank, prompt: str, sampling: Sampling, reward_names: list[str], limits: Limits | None = None
) -> list[Column]:
    """Generate, score and diff every column of `bank` for `prompt` (column 0 is the base)."""
    limits = limits or Limits()
    if not prompt or not prompt.strip():
        raise CompareError("the prompt is empty: type a prompt or pick an example")
    if len(prompt) > limits.max_prompt_chars:
        raise CompareError(
            f"the prompt has {len(prompt)} characters; the limit is {limits.max_prompt_chars} "
            "(shorten it or raise GRPO_HUB_MAX_PROMPT_CHARS)"
        )
    sampling.check(limits)
    columns = []
    for index, label in enumerate(bank.labels):
        completions = bank.generate(index, prompt, sampling)
        rewards = score(reward_names, prompt, completions)
        columns.append(
            Column(
                label,
                completions,
                rewards,
                correct=correctness(prompt, completions),
                provenance=bank.provenance[index],
            )
        )
    for column in columns[1:]:
        column.diffs = [
            diff_segments(b, o) for b, o in zip(columns[0].completions, column.completions, strict=True)
        ]
    return columns
