"""Selective rollout (GRESO): before a generation batch is generated, skip the prompts predicted zero-signal.

The rule and its source are in `grpo_hub.algos.selection`. This module is the trainer glue:

- Prompt id: a hash (blake2b, 64 bit) of the dataset column `selective_rollout_id_column`, else of the prompt
  (text or chat messages, JSON-encoded), so the id is the same on every rank, run and resume. The id column is one
  of the trainer's signature columns (`signature_columns`), so `remove_unused_columns=True` keeps it.
- `SelectiveRollout.select(inputs)`: gathers the generation batch of every rank (TRL's RepeatSampler puts each
  prompt `num_generations` times in a row; rank k holds rows [k·n, (k+1)·n)), decides per group with the shared
  generator (seeded from `args.seed`; every rank holds the same history and draws the same numbers, so every
  rank takes the same decisions). What takes a skipped group's place is `selective_rollout_mode`:
  - "replace": the next groups of the epoch, read through the `GenerationBatchStream` (one period per generation
    batch, see `grpo_hub.training.batch_stream`). It returns this rank's slice of exactly as many groups as it was
    given, so TRL's per-rank row counts do not change. Groups of the last batch read that were not needed are
    carried over and come first in the next selection, so every prompt is still considered once per pass over the
    data. When the epoch runs out, the shortfall is filled with the groups it skipped, in order: the step trains
    on the prompts there are, and its size never changes.
  - "shrink": nothing. The batch is the kept groups, topped up with skipped ones (in order) to the smallest count
    that every rank and every micro-step of the generation batch split evenly (`shrunk_group_count`), so the step
    generates fewer rows (GRESO's rollout saving) and the epoch keeps its step count.
- `SelectiveRollout.record(rewards)`: the gathered rewards of the groups just scored update the history and
  the exploration probabilities (once per scored generation batch, also per dynamic-sampling round).
- `checkpointed(selector)`: writes the state (history, exploration probabilities, generator state, observed
  reward range, carried-over groups) into every checkpoint and restores it on resume. Where the epoch stands is
  the stream's own checkpoint (`grpo_hub.training.batch_stream`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque

import torch

from grpo_hub.algos.advantages import ALL_MAX, ALL_MIN, KIND_NAMES, zero_signal_kinds
from grpo_hub.algos.selection import (
    TARGET_SHARE,
    OutcomeHistory,
    adapt_exploration,
    kind_fractions,
    skip_probabilities,
)
from grpo_hub.training.checkpoint_state import CheckpointedState

STATE_FILE = "selective_rollout.pt"
DECISIONS_KEPT = 4096


def prompt_id(row: dict, column: str | None) -> int:
    """Stable signed 64-bit id of a dataset row: hash of `row[column]`, or of `row["prompt"]`."""
    key = column or "prompt"
    if key not in row:
        raise ValueError(
            f"`selective_rollout_id_column`: the dataset rows have no column {key!r} (columns: {sorted(row)}). "
            "Fix: name an existing column, or leave it None to key prompts by a hash of the prompt."
        )
    text = json.dumps(row[key], sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def signature_columns(columns: list[str], *extra: str | None) -> list[str]:
    """The dataset columns the trainer keeps under `remove_unused_columns=True` (TRL's: prompt, image, images),
    plus the `extra` ones features read (None: none), e.g. the id column the prompt ids are read from."""
    return [*columns, *(c for c in dict.fromkeys(extra) if c is not None and c not in columns)]


def shrunk_group_count(kept: int, total: int, group_size: int, row_multiple: int) -> int:
    """Groups a shrunk batch generates: `kept` rounded up to the smallest count > 0 whose rows are a multiple of
    `row_multiple` (ranks x micro-steps per generation batch, so each rank's share splits evenly), at most `total`
    (the batch as given, which splits evenly by construction)."""
    unit = row_multiple // math.gcd(row_multiple, group_size)
    return min(total, max(unit, -(-kept // unit) * unit))


def _groups(rows: list, group_size: int) -> list[list]:
    return [rows[i : i + group_size] for i in range(0, len(rows), group_size)]


class SelectiveRollout:
    """Skip decisions before generation, history updates after scoring (see the module docstring).

    Narrow inputs from the trainer: `stream` (a `GenerationBatchStream`), `gather_objects` (list of this rank ->
    lists of all ranks concatenated), `gather` (tensor all-gather), this `rank`, `row_multiple` (processes x
    micro-steps per generation batch) and the train `metrics` dict.
    """

    def __init__(
        self, *, stream, gather_objects, gather, rank: int, group_size: int, id_column: str | None, mode: str,
        row_multiple: int,
        explore_init: float, target: float, step: float, min_keep: float, revisit_after: int | None, eps: float,
        reward_min: float | None, reward_max: float | None, seed: int, metrics,
    ):  # fmt: skip
        self.stream, self.gather_objects, self.gather, self.metrics = stream, gather_objects, gather, metrics
        self.rank, self.group_size, self.id_column = rank, group_size, id_column
        self.mode, self.row_multiple = mode, row_multiple
        self.target, self.step, self.min_keep, self.eps = target, step, min_keep, eps
        self.revisit_after = revisit_after
        self.reward_bounds = (reward_min, reward_max)
        self.history = OutcomeHistory()
        self.explore = {ALL_MAX: explore_init, ALL_MIN: explore_init}
        self.generator = torch.Generator().manual_seed(seed)
        self.seen = [float("inf"), float("-inf")]  # reward range observed so far
        self._scoring: list[int] | None = None  # ids of the groups being scored, all ranks, in row order
        self._leftover: list[list] = []  # groups read but not needed by the last selection (all ranks' rows)
        self._step_kinds: list[torch.Tensor] = []  # kinds of the groups scored in this optimizer step
        self.decisions = deque(maxlen=DECISIONS_KEPT)  # recent (prompt id, skipped), for inspection

    @classmethod
    def from_config(cls, args, *, num_processes: int, **wiring) -> SelectiveRollout:
        """A selector with the `selective_rollout_*` fields of `args` (a GRPOHubConfig) and the trainer's `wiring`."""
        return cls(
            id_column=args.selective_rollout_id_column,
            mode=args.selective_rollout_mode,
            row_multiple=num_processes * args.steps_per_generation,
            explore_init=args.selective_rollout_explore_init,
            target=args.selective_rollout_target_zero_frac,
            step=args.selective_rollout_explore_step,
            min_keep=args.selective_rollout_min_keep_prob,
            revisit_after=args.selective_rollout_revisit_after,
            eps=args.zero_signal_eps,
            reward_min=args.selective_rollout_reward_min,
            reward_max=args.selective_rollout_reward_max,
            seed=args.seed,
            **wiring,
        )

    def _next_inputs(self):
        """The next generation batch on this rank, or None on every rank if any rank has none."""
        inputs = self.stream.next_batch()
        have = self.gather(torch.tensor([inputs is not None]))
        return inputs if bool(have.all()) else None

    def select(self, inputs: list) -> list:
        """This rank's rows of the groups to generate: as many as `inputs` holds, skipped groups replaced."""
        rows = self.gather_objects(list(inputs))
        wanted = len(rows) // self.group_size
        kept, skipped, batches_read, exhausted = [], [], 0, False
        candidates, self._leftover = self._leftover + _groups(rows, self.group_size), []
        while True:
            ids = [prompt_id(group[0], self.id_column) for group in candidates]
            kinds, streaks, skips = self.history.lookup(ids)
            probs = skip_probabilities(kinds, streaks, self.explore, self.min_keep, skips, self.revisit_after)
            draws = torch.rand(len(ids), generator=self.generator, dtype=torch.float64)
            for j, group in enumerate(candidates):
                if len(kept) == wanted:
                    self._leftover = candidates[j:]
                    break
                skip = bool(draws[j] < probs[j])
                self.decisions.append((ids[j], skip))
                (skipped if skip else kept).append((ids[j], int(kinds[j]), group))
            if len(kept) == wanted or self.mode == "shrink":
                break
            more = self._next_inputs()
            if more is None:
                exhausted = True
                break
            batches_read += 1
            candidates = _groups(self.gather_objects(list(more)), self.group_size)
        if self.mode == "shrink":
            wanted = shrunk_group_count(len(kept), wanted, self.group_size, self.row_multiple)
        filled, skipped = skipped[: wanted - len(kept)], skipped[wanted - len(kept) :]
        kept += filled
        self.history.mark_skipped([prompt for prompt, _, _ in skipped])
        self._scoring = [prompt for prompt, _, _ in kept]
        self._log_selection(skipped, batches_read, exhausted)
        flat = [row for _, _, group in kept for row in group]
        share = len(flat) * len(inputs) // len(rows)  # this rank's share of the kept rows
        return flat[self.rank * share : (self.rank + 1) * share]

    def record(self, rewards: torch.Tensor) -> None:
        """Update the history and exploration probabilities from the gathered rewards of the selected groups."""
        if self._scoring is None:
            raise RuntimeError("SelectiveRollout.record() called without a preceding select()")
        valid = rewards[~torch.isnan(rewards)]
        if valid.numel():
            self.seen = [min(self.seen[0], float(valid.min())), max(self.seen[1], float(valid.max()))]
        low = self.seen[0] if self.reward_bounds[0] is None else self.reward_bounds[0]
        high = self.seen[1] if self.reward_bounds[1] is None else self.reward_bounds[1]
        kinds = zero_signal_kinds(rewards.detach().cpu(), self.group_size, self.eps, low, high)
        revisits, informative = self.history.record(self._scoring, kinds.tolist())
        self._scoring = None
        self._step_kinds.append(kinds)
        if revisits:
            self.metrics["selective_rollout/revisit_informative_frac"].append(informative / revisits)

    def end_step(self) -> None:
        """Once per optimizer step, after its last scoring: move each kind's exploration probability by the kind
        fractions pooled over the step's scorings, from the second epoch on (GRESO's `ray_trainer.py`: once per
        training step, `if epoch > 0`; in the first epoch nothing can be skipped yet, so the fractions say
        nothing about the skipping)."""
        pooled, self._step_kinds = self._step_kinds, []
        if not pooled or self.stream.epoch == 0:
            return
        for kind, frac in kind_fractions(torch.cat(pooled)).items():
            self.explore[kind] = adapt_exploration(
                self.explore[kind], frac, self.target * TARGET_SHARE[kind], self.step
            )

    def _log_selection(self, skipped, batches_read: int, exhausted: bool) -> None:
        metrics = self.metrics
        for kind, name in KIND_NAMES.items():
            metrics[f"selective_rollout/skipped_{name}"].append(float(sum(k == kind for _, k, _ in skipped)))
            metrics[f"selective_rollout/explore_{name}"].append(self.explore[kind])
        metrics["selective_rollout/rows_saved"].append(float(len(skipped) * self.group_size))
        metrics["selective_rollout/groups_generated"].append(float(len(self._scoring)))
        metrics["selective_rollout/batches_read"].append(float(batches_read))
        metrics["selective_rollout/data_exhausted"].append(float(exhausted))

    def state_dict(self) -> dict:
        return {
            "history": self.history.state_dict(),
            "explore": torch.tensor([self.explore[ALL_MAX], self.explore[ALL_MIN]], dtype=torch.float64),
            "generator": self.generator.get_state(),
            "seen": torch.tensor(self.seen, dtype=torch.float64),
            "leftover": self._leftover,
        }

    def load_state_dict(self, state: dict) -> None:
        self.history.load_state_dict(state["history"])
        self.explore = dict(zip((ALL_MAX, ALL_MIN), state["explore"].tolist(), strict=True))
        self.generator.set_state(state["generator"])
        self.seen = state["seen"].tolist()
        self._leftover = state["leftover"]


def checkpointed(selector: SelectiveRollout) -> CheckpointedState:
    """The callback that saves the selective-rollout state in every checkpoint and restores it on resume."""
    return CheckpointedState(selector, STATE_FILE, "selective_rollout=True", "the prompt history")
