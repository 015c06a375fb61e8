"""Hint-guided rollouts (`GRPOHubConfig.hint_column`): the trainer glue. The rules are `grpo_hub.algos.hints`.

- `HintedRollouts.apply(inputs, progress)`: before a training batch is generated, each row gets its hint (the first
  steps of its solution; its state's length, under the run's ceiling) in the column `hint` ("" when none), and a
  hinted prompt ends with it: a conversational prompt gains an assistant message holding the hint (marked
  `HINT_MARK`), a text prompt the hint's text. Every row of a prompt gets the same hint, so its group compares
  completions of one context. Evaluation rows are never hinted.
- `prompt_ids(prompts, tokenize)` (the trainer's `_tokenize_prompts`): a marked message is not rendered as a
  message of its own: the prompt before it is rendered with TRL's generation prompt and the hint's tokens follow, so
  the hint is the beginning of the assistant's answer and the model continues it. Everything after (vLLM, the
  scoring and training forwards, padding-free, shared prompts) sees the hint as part of the prompt: context, with no
  loss, KL or entropy on it.
- `for_rewards(inputs, prompts, completions)`: reward functions get the prompt without the hint and the completion
  with the hint in front (the whole answer), and the `hint` column, so a step reward can leave the hint's steps out.
- `record(inputs, rewards)`: right answers (the weighted reward >= `hint_success_threshold`) count towards each
  state's window; a full window decides its length (`algos.hints.windowed_hint_length`); the step is logged.
- `checkpointed(hints)`: every state's length and window counts in each checkpoint, restored on resume.
"""

from __future__ import annotations

import copy
import functools

import torch

from grpo_hub.algos.hints import hint_ceiling, hint_text, longest_hint, solution_steps, windowed_hint_length
from grpo_hub.algos.rollout_budget import group_outcomes
from grpo_hub.errors import field_error
from grpo_hub.training.checkpoint_state import CheckpointedState
from grpo_hub.training.selective_rollout import prompt_id

STATE_FILE = "hints.pt"
HINT_COLUMN = "hint"  # the column every training row carries while hints are on: its hint text, "" when none
HINT_MARK = "grpo_hub_hint"  # marks the assistant message that holds a conversational prompt's hint


class HintedRollouts:
    """Every state's hint length (a state: one prompt, or one value of `group_column`) and the batch's hints.

    Narrow inputs from the trainer: `gather_objects` (list of this rank -> lists of all ranks concatenated),
    `encode` (text -> token ids, no special tokens), the settings and the train `metrics`."""

    def __init__(
        self, *, gather_objects, column: str, separator: str, group_column: str | None, threshold: float,
        shorten_at: float, window: int, end: float | None, max_hint_tokens: int, encode, metrics,
    ):  # fmt: skip
        self.gather_objects, self.encode, self.metrics = gather_objects, encode, metrics
        self.column, self.separator, self.group_column = column, separator, group_column
        self.threshold, self.shorten_at, self.window, self.end = threshold, shorten_at, window, end
        self.max_hint_tokens = max_hint_tokens  # max_completion_length: a hint must leave room for an answer
        self.lengths: dict = {}  # state key -> hint length (steps)
        self.counts: dict = {}  # state key -> [right, scored] completions at that length in the current window

    # --- the batch's hints ---
    def steps(self, row: dict) -> list[str]:
        """The steps of `row`'s solution; one line naming `hint_column` when it has none."""
        if self.column not in row:
            field_error("hint_column", f"the dataset rows have no column {self.column!r} (columns: {sorted(row)}).",
                        "name the column that holds each prompt's reference solution.")  # fmt: skip
        steps = solution_steps(row[self.column], self.separator)
        if not steps:
            field_error("hint_column", f"a row's solution is empty ({row[self.column]!r}), so it has no step to hint.",
                        "give every row a reference solution, or filter the empty ones out.")  # fmt: skip
        return steps

    def key(self, row: dict):
        """The state `row` belongs to: its `group_column` value, else its prompt (without a hint)."""
        if self.group_column is None:
            return prompt_id({"prompt": unhinted_prompt(row)}, None)
        if self.group_column not in row:
            field_error("hint_group_column", f"the dataset rows have no column {self.group_column!r} "
                        f"(columns: {sorted(row)}).", "name an existing column, or leave it None.")  # fmt: skip
        return row[self.group_column]

    def apply(self, inputs: list, progress: float) -> list:
        """`inputs` with each row's hint (`progress`: the share of the run's steps done, for `hint_ceiling`)."""
        rows = []
        for row in inputs:
            steps = self.steps(row)
            length = min(self.lengths.get(self.key(row), 0), hint_ceiling(len(steps), progress, self.end))
            rows.append(with_hint(row, hint_text(steps, length, self.separator)))
        for hint in {row[HINT_COLUMN] for row in rows} - {
            ""
        }:  # a prompt's rows share one hint: each checked once
            tokens = len(self.encode(hint))
            if tokens >= self.max_hint_tokens:
                field_error("hint_column", f"the hint {hint!r} is {tokens} tokens, which leaves no room for an "
                            f"answer within max_completion_length={self.max_hint_tokens}.",
                            "raise max_completion_length, or split solutions into shorter steps.")  # fmt: skip
        return rows

    def at_step(self, state) -> functools.partial:
        """`apply` at the trainer's `state` (its global_step of max_steps)."""
        return functools.partial(self.apply, progress=state.global_step / max(state.max_steps, 1))

    def prompt_ids(self, prompts: list, tokenize) -> tuple:
        """`tokenize(prompts)` (TRL's `_tokenize_prompts`: ids, images, fields) where each marked hint message is
        left out of the chat template and its text's tokens end the prompt instead."""
        hints = [
            p[-1]["content"] if isinstance(p, list) and p and p[-1].get(HINT_MARK) else "" for p in prompts
        ]
        if not any(hints):
            return tokenize(prompts)
        ids, images, fields = tokenize(
            [p[:-1] if hint else p for p, hint in zip(prompts, hints, strict=True)]
        )
        return [[*i, *(self.encode(h) if h else [])] for i, h in zip(ids, hints, strict=True)], images, fields

    # --- what reward functions see, and what their rewards teach ---
    @staticmethod
    def for_rewards(inputs: list, prompts: list, completions: list) -> tuple[list, list]:
        """(prompts without their hints, completions with their hints in front): the whole answer is scored."""
        hints = [row[HINT_COLUMN] for row in inputs]
        prompts = [
            unhinted_prompt({"prompt": p, HINT_COLUMN: h}) for p, h in zip(prompts, hints, strict=True)
        ]
        return prompts, [prefixed(c, h) for c, h in zip(completions, hints, strict=True)]

    def record(self, inputs: list, rewards: torch.Tensor) -> None:
        """Update each state's length from the weighted `rewards` of all ranks' rows (gathered, in rank order): a
        completion is right when its reward reaches the threshold (`algos.rollout_budget.group_outcomes`, the rule
        rollout budgets count solved completions by); log the step."""
        rows = self.gather_objects([(self.key(row), *self.hint_length(row)) for row in inputs])
        # per row: (right, scored)
        outcomes = group_outcomes(rewards.tolist(), [1] * len(rows), self.threshold)
        by_key: dict = {}  # key -> [right, scored, longest hint used, longest hint possible, hint shares]
        for (key, used, steps), (right, scored) in zip(rows, outcomes, strict=True):
            entry = by_key.setdefault(key, [0, 0, 0, 0, []])
            entry[0], entry[1] = entry[0] + right, entry[1] + scored
            entry[2], entry[3] = max(entry[2], used), max(entry[3], longest_hint(steps))
            entry[4].append(used / steps)
        for key, (right, scored, used, most, _) in by_key.items():
            if used != self.lengths.get(key, 0):  # cut by the run's ceiling or the solutions: a new window
                self.counts[key] = [0, 0]
            seen = self.counts.get(key, [0, 0])
            length, *counts = windowed_hint_length(
                used, seen[0] + right, seen[1] + scored, self.window, self.shorten_at, most
            )
            self.lengths[key], self.counts[key] = length, counts
        self._log(rows, outcomes, by_key)

    def hint_length(self, row: dict) -> tuple[int, int]:
        """(how many steps of `row`'s solution its hint holds, how many steps the solution has)."""
        steps = self.steps(row)
        for length in range(longest_hint(len(steps)) + 1):
            if hint_text(steps, length, self.separator) == row[HINT_COLUMN]:
                return length, len(steps)
        raise ValueError(
            f"`hint_column`: the row's hint {row[HINT_COLUMN]!r} is not a prefix of its solution"
        )

    def _log(self, rows: list, outcomes: list, by_key: dict) -> None:
        metrics = self.metrics
        shares = [used / steps for _, used, steps in rows]
        hinted = [share > 0 for share in shares]
        metrics["hints/share_hinted"].append(sum(hinted) / max(len(rows), 1))
        metrics["hints/length"].append(sum(shares) / max(sum(hinted), 1))
        for name, chosen in (("hinted", True), ("unhinted", False)):
            picked = [outcome for outcome, h in zip(outcomes, hinted, strict=True) if h == chosen]
            scored = sum(n for _, n in picked)
            if scored:
                metrics[f"hints/right_{name}"].append(sum(r for r, _ in picked) / scored)
        if self.group_column is not None:
            for key in sorted(by_key, key=str):
                right, scored, _, _, key_shares = by_key[key]
                metrics[f"hints/length/{key}"].append(sum(key_shares) / len(key_shares))
                if scored:
                    metrics[f"hints/right/{key}"].append(right / scored)

    def state_dict(self) -> dict:
        return {"lengths": dict(self.lengths), "counts": dict(self.counts)}

    def load_state_dict(self, state: dict) -> None:
        self.lengths, self.counts = dict(state["lengths"]), {k: list(v) for k, v in state["counts"].items()}


def with_hint(row: dict, hint: str) -> dict:
    """`row` with its `hint` column and, when there is a hint, a prompt that ends with it."""
    row = {**row, HINT_COLUMN: hint}
    if hint:
        prompt = row["prompt"]
        if isinstance(prompt, str):
            row["prompt"] = prompt + hint
        else:
            row["prompt"] = [*copy.deepcopy(prompt), {"role": "assistant", "content": hint, HINT_MARK: True}]
    return row


def unhinted_prompt(row: dict):
    """`row`'s prompt without its hint."""
    prompt, hint = row["prompt"], row.get(HINT_COLUMN, "")
    if isinstance(prompt, str):
        return prompt[: len(prompt) - len(hint)] if hint and prompt.endswith(hint) else prompt
    return [m for m in prompt if not m.get(HINT_MARK)]


def prefixed(completion, hint: str):
    """`completion` (text, or assistant messages) with `hint` in front of its text."""
    if not hint:
        return completion
    if isinstance(completion, str):
        return hint + completion
    first = completion[0]
    return [{**first, "content": hint + (first.get("content") or "")}, *completion[1:]]


def from_config(args, tokenizer, gather_objects, dataset, *, metrics, **_) -> HintedRollouts | None:
    """The trainer's hints with `args.hint_column` set (after `check_dataset`), else None; `tokenizer` encodes each
    hint's text."""
    if args.hint_column is None:
        return None
    check_dataset(dataset, args.hint_column, args.hint_separator)
    return HintedRollouts(
        column=args.hint_column, separator=args.hint_separator, group_column=args.hint_group_column,
        threshold=args.hint_success_threshold, shorten_at=args.hint_shorten_at, window=args.hint_window,
        end=args.hint_end,
        max_hint_tokens=args.max_completion_length, gather_objects=gather_objects, metrics=metrics,
        encode=functools.partial(tokenizer.encode, add_special_tokens=False),
    )  # fmt: skip


def check_dataset(dataset, column: str, separator: str, rows: int = 256) -> None:
    """One line naming the field when the training `dataset` (a `datasets.Dataset`; others are checked row by row as
    they come) has no `column`, or when none of its first `rows` solutions splits into two steps at `separator`."""
    names = getattr(dataset, "column_names", None)
    if names is None:
        return
    if column not in names:
        field_error("hint_column", f"the training dataset has no column {column!r} (columns: {sorted(names)}).",
                    "name the column that holds each prompt's reference solution.")  # fmt: skip
    if not hasattr(dataset, "select"):  # an iterable dataset: its rows are checked as they come
        return
    solutions = dataset.select(range(min(rows, len(dataset))))[column]
    if not any(len(solution_steps(s, separator)) > 1 for s in solutions if isinstance(s, (str, list, tuple))):
        field_error("hint_separator", f"{separator!r} splits none of the first {len(solutions)} solutions of "
                    f"{column!r} into two steps, so no prompt could be hinted (e.g. {solutions[0]!r}).",
                    "set hint_separator to the text between steps, or give each solution as a list of steps.")  # fmt: skip


def checkpointed(hints: HintedRollouts) -> CheckpointedState:
    """The callback that saves every state's hint length in each checkpoint and restores it on resume."""
    return CheckpointedState(hints, STATE_FILE, "hint_column set", "every prompt's hint length")
