"""Per-prompt rollout budgets (`GRPOHubConfig.rollout_budget="knapsack"`, Knapsack RL): the trainer glue.

The rule is `grpo_hub.algos.rollout_budget`; this module decides what it is given and what comes of it:

- `RolloutBudgets.assign(inputs)`: gathers the generation batch of every rank (TRL's RepeatSampler puts each prompt
  `num_generations` times in a row; rank k holds rows [k·n, (k+1)·n)), estimates each prompt's success rate from its
  earlier groups (`success_estimates`: a Beta prior centred on the success rate of every completion scored so far,
  itself under a uniform prior (`succession_rate`, never 0 or 1), `PRIOR_STRENGTH` completions strong, so a prompt
  never seen gets that rate), shares the batch's rows out among its
  prompts (`allocate_budgets`, each within [rollout_budget_min, rollout_budget_max]) and returns this rank's rows:
  the same number as given, each prompt's row repeated its budget times, prompts in their order. A group may span
  two ranks: TRL gathers rewards over all ranks and the advantages are computed over all of them (`sizes`).
- `RolloutBudgets.record(rewards)`: the gathered rewards of the batch just scored update each prompt's history. A
  completion counts as solved when its reward is at least `rollout_budget_success_threshold` (`group_outcomes`: a
  fixed threshold, so early and late history count alike); unscorable (NaN) rewards count for nothing.
- `checkpointed(budgets)`: the history in every checkpoint, restored on resume.

With every estimate equal (the first step, or `rollout_budget_min == rollout_budget_max == num_generations`) every
budget is `num_generations`: TRL's batch, row for row.
"""

from __future__ import annotations

import copy
import statistics

import torch

from grpo_hub.algos.advantages import zero_signal_mask
from grpo_hub.algos.rollout_budget import allocate_budgets, group_outcomes, success_estimates, succession_rate
from grpo_hub.errors import field_message
from grpo_hub.training.checkpoint_state import CheckpointedState
from grpo_hub.training.selective_rollout import prompt_id

STATE_FILE = "rollout_budget.pt"
# Pseudo-completions of the prior: a prompt's first group of 8 outweighs it 4:1, and a prompt with no solved
# completion yet keeps an estimate above 0 (0 would make its value, and so its budget beyond the minimum, nothing).
PRIOR_STRENGTH = 2.0
DEFAULT_MAX_GROUPS = (
    4  # rollout_budget_max None: 4 x num_generations (Knapsack RL's budgets reach ~12x the mean)
)


class RolloutBudgets:
    """Per-prompt budgets of the generation batch being scored, and every prompt's outcomes so far.

    Narrow inputs from the trainer: `gather_objects` (list of this rank -> lists of all ranks concatenated), this
    `rank`, `group_size` (num_generations), the `objective`, the bounds, the dataset `column`, the reward at which a
    completion counts as solved (`threshold`) and its train `metrics`.
    """

    def __init__(
        self, *, gather_objects, rank: int, group_size: int, objective: str, low: int, high: int | None,
        column: str | None, threshold: float, metrics,
    ):  # fmt: skip
        self.gather_objects, self.rank, self.metrics = gather_objects, rank, metrics
        self.group_size, self.objective, self.column, self.threshold = (
            group_size,
            objective,
            column,
            threshold,
        )
        self.low, self.high = low, high or DEFAULT_MAX_GROUPS * group_size
        self.history: dict[int, list[float]] = {}  # prompt id -> [solved, scored] completions
        self.column_history: dict = {}  # `column` value -> [solved, scored] completions
        self.sizes: list[int] | None = None  # group sizes of the batch being scored (all ranks, row order)
        self._ids: list[int] = []  # prompt ids of those groups
        self._labels: list = []  # their `column` values (None without a column)

    @classmethod
    def from_config(cls, args, **wiring) -> RolloutBudgets:
        return cls(
            objective=args.rollout_budget, low=args.rollout_budget_min, high=args.rollout_budget_max,
            column=args.rollout_budget_column, threshold=args.rollout_budget_success_threshold, **wiring,
        )  # fmt: skip

    def estimates(self, ids: list[int], labels: list) -> list[float]:
        """Each prompt's estimated success rate (`success_estimates`): the prior is the success rate
        (`succession_rate`) of its `column` value's completions so far, else of every completion (0.5 before any)."""
        run_rate = succession_rate(*(sum(h[i] for h in self.history.values()) for i in (0, 1)))
        estimates = []
        for prompt, label in zip(ids, labels, strict=True):
            seen = self.history.get(prompt, [0.0, 0.0])
            label_solved, label_scored = self.column_history.get(label, [0.0, 0.0])
            prior = succession_rate(label_solved, label_scored) if label_scored else run_rate
            estimates += success_estimates([seen[0]], [seen[1]], prior, PRIOR_STRENGTH)
        return estimates

    def assign(self, inputs: list) -> list:
        """This rank's rows of the batch with each prompt repeated its budget times (as many rows as `inputs`)."""
        rows = self.gather_objects(list(inputs))
        groups = [rows[i : i + self.group_size] for i in range(0, len(rows), self.group_size)]
        if any(row["prompt"] != group[0]["prompt"] for group in groups for row in group):
            raise ValueError(
                "`rollout_budget`: a generation batch's rows are not groups of num_generations rows of one prompt "
                "(TRL's RepeatSampler order). Fix: use the trainer's own sampler, or rollout_budget='uniform'."
            )
        self._ids = [prompt_id(group[0], None) for group in groups]
        self._labels = [None if self.column is None else _label(group[0], self.column) for group in groups]
        high = min(self.high, len(rows) - self.low * (len(groups) - 1))
        self.sizes = allocate_budgets(
            self.estimates(self._ids, self._labels), len(rows), self.low, high, self.objective
        )
        budgeted = [
            group[0] if copy_index == 0 else copy.copy(group[0])
            for group, size in zip(groups, self.sizes, strict=True)
            for copy_index in range(size)
        ]
        return budgeted[self.rank * len(inputs) : (self.rank + 1) * len(inputs)]

    def record(self, rewards: torch.Tensor, advantages: torch.Tensor, logged_advantages) -> None:
        """Update the history from the gathered `rewards` of the batch `assign` built and log the budgets. TRL
        computed its logged group statistics over `num_generations` rows at a time: with ragged groups its
        `frac_reward_zero_std` and its logged advantages (`logged_advantages`, TRL's deque) are replaced by each
        group's own (`advantages`: all ranks' rows, as recomputed)."""
        outcomes = group_outcomes(rewards.tolist(), self.sizes, self.threshold)
        for prompt, label, outcome in zip(self._ids, self._labels, outcomes, strict=True):
            for entry in (
                self.history.setdefault(prompt, [0.0, 0.0]),
                self.column_history.setdefault(label, [0.0, 0.0]),
            ):
                entry[0] += outcome[0]
                entry[1] += outcome[1]
        self._log(rewards, outcomes)
        if len(set(self.sizes)) > 1:
            self.metrics["frac_reward_zero_std"][-1] = float(
                zero_signal_mask(rewards, self.sizes).double().mean()
            )
            for _ in range(len(advantages)):
                logged_advantages.pop()
            logged_advantages.extend(advantages.tolist())

    def _log(self, rewards: torch.Tensor, outcomes: list[tuple[int, int]]) -> None:
        sizes, metrics = self.sizes, self.metrics
        scored = sum(outcome[1] for outcome in outcomes)
        if (
            scored
        ):  # the share of the batch's completions counted solved (0 or 1 every step: check the threshold)
            metrics["rollout_budget/frac_solved"].append(sum(outcome[0] for outcome in outcomes) / scored)
        metrics["rollout_budget/min"].append(float(min(sizes)))
        metrics["rollout_budget/max"].append(float(max(sizes)))
        metrics["rollout_budget/std"].append(statistics.pstdev(sizes))
        signal = ~zero_signal_mask(rewards, sizes)
        metrics["rollout_budget/frac_groups_with_signal"].append(
            float(signal[torch.tensor(sizes).cumsum(0) - 1].double().mean())
        )
        metrics["rollout_budget/frac_completions_with_signal"].append(float(signal.double().mean()))
        for label in sorted(set(self._labels) - {None}, key=str):
            mine = [size for size, other in zip(sizes, self._labels, strict=True) if other == label]
            metrics[f"rollout_budget/completions/{label}"].append(sum(mine) / len(mine))

    def state_dict(self) -> dict:
        return {
            "history": dict(self.history),
            "column_history": dict(self.column_history),
            "success_threshold": self.threshold,
        }

    def load_state_dict(self, state: dict) -> None:
        """The history of `state_dict`. A history counted at another threshold is refused (its counts cannot be
        re-made: the rewards are not kept); one saved before the threshold (with a `reward_range`: solved meant the
        upper half of the rewards seen) loads its counts as they were."""
        saved = state.get("success_threshold", self.threshold)
        if saved != self.threshold:
            raise ValueError(
                field_message(
                    "rollout_budget_success_threshold",
                    f"is {self.threshold}, but the resumed checkpoint's history counted a completion solved at "
                    f"{saved}.",
                    f"resume with rollout_budget_success_threshold={saved}.",
                )
            )
        self.history = {int(k): [float(x) for x in v] for k, v in state["history"].items()}
        self.column_history = {k: [float(x) for x in v] for k, v in state["column_history"].items()}


def _label(row: dict, column: str):
    if column not in row:
        raise ValueError(
            f"`rollout_budget_column`: the dataset rows have no column {column!r} (columns: {sorted(row)}). "
            "Fix: name an existing column, or leave it None."
        )
    return row[column]


def checkpointed(budgets: RolloutBudgets) -> CheckpointedState:
    """The callback that saves the prompts' history in every checkpoint and restores it on resume."""
    return CheckpointedState(budgets, STATE_FILE, "rollout_budget='knapsack'", "the prompts' history")
