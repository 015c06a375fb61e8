"""DAPO dynamic sampling: refill a generation batch with fresh rollouts until it holds enough informative groups.

DAPO (arXiv:2503.14476, §3.2 "Dynamic Sampling"; verl `algorithm.filter_groups` in recipe/dapo) drops the
groups whose rewards are all equal (no gradient: every advantage is 0), keeps generating new prompts until
the batch holds `train_batch_size` informative groups, and truncates to exactly that many, so every
optimizer step trains on the same number of groups. verl caps the extra generations with
`max_num_gen_batches` and raises when the cap is hit; here `dynamic_sampling_on_cap` chooses between
training on what was collected ("train") and raising ("error").

Where the extra prompts come from: the trainer's epoch iterator, read in whole generation batches by
`grpo_hub.training.batch_stream.GenerationBatchStream` (shared with selective rollout), so prompts are used in
the sampler's order, each once per epoch; one optimizer step consumes 1 + `rounds` generation batches.
transformers computes the steps per epoch assuming one: an epoch therefore ends after fewer optimizer steps
(the later steps of the epoch get no data and do nothing), and with `max_steps` a run whose data runs out stops
early. A refill round that finds the epoch exhausted stops refilling (metric `dynamic_sampling/data_exhausted`) and trains
on what it has. The stream's position is checkpointed, so a resumed run reads what the uninterrupted run would.

Pure helpers (`informative_groups`, `select_groups`, `rank_rows`, `concat_batches`) import
torch only; `DynamicSampler` is the trainer glue.
"""

from __future__ import annotations

import functools

import torch

from grpo_hub.algos.filtering import COMPLETION_KEYS
from grpo_hub.training import filtering
from grpo_hub.training.batch_stream import GenerationBatchStream

PROMPT_KEYS = ("prompt_ids", "prompt_mask")
# Right-padding values of completion-aligned tensors (others pad with 0). TRL pads tool_mask with 1.
COMPLETION_PAD = {"tool_mask": 1, "importance_sampling_ratio": 1.0}
SUMMED_SCALARS = ("num_items_in_batch",)


def informative_groups(zero_rows: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N / group_size,) bool: True for groups with signal, from a (N,) per-row zero-signal mask."""
    return ~zero_rows.view(-1, group_size)[:, 0]


def select_groups(informative: list[torch.Tensor], target: int) -> list[torch.Tensor]:
    """Per round, the groups kept: the first `target` informative groups in (round, group) order.

    DAPO keeps exactly `train_batch_size` groups: verl concatenates the filtered batches and slices the first
    `train_batch_size` prompts. Fewer than `target` informative groups in all rounds: all of them are kept.
    """
    remaining, kept = target, []
    for groups in informative:
        keep = groups & (groups.long().cumsum(0) <= remaining)
        remaining -= int(keep.sum())
        kept.append(keep)
    return kept


def rank_rows(kept_groups: torch.Tensor, group_size: int, rank: int, rows_per_rank: int) -> torch.Tensor:
    """(rows_per_rank,) bool: this rank's rows of the kept groups (rank k holds rows [k·n, (k+1)·n) of a round)."""
    rows = kept_groups.repeat_interleave(group_size)
    return rows[rank * rows_per_rank : (rank + 1) * rows_per_rank]


def _pad_columns(value: torch.Tensor, width: int, fill, left: bool) -> torch.Tensor:
    missing = width - value.shape[1]
    if missing == 0:
        return value
    pad = value.new_full((value.shape[0], missing, *value.shape[2:]), fill)
    return torch.cat([pad, value] if left else [value, pad], dim=1)


def _merge(key: str, values: list, pad_token_id: int):
    first = values[0]
    if isinstance(first, list):
        return [item for value in values for item in value]
    if not isinstance(first, torch.Tensor):
        raise ValueError(f"dynamic sampling cannot merge the non-tensor batch entry {key!r}")
    if first.ndim == 0:
        if key in SUMMED_SCALARS:
            return torch.stack(values).sum()
        if any(not torch.equal(v, first) for v in values):
            raise ValueError(f"dynamic sampling cannot merge the scalar {key!r}: it differs between rounds")
        return first
    if first.ndim >= 2 and (key in PROMPT_KEYS or key in COMPLETION_KEYS or key == "advantages"):
        width = max(v.shape[1] for v in values)
        is_ids = key in ("prompt_ids", "completion_ids")
        fill = pad_token_id if is_ids else COMPLETION_PAD.get(key, 0)
        values = [_pad_columns(v, width, fill, left=key in PROMPT_KEYS) for v in values]
    return torch.cat(values, dim=0)


def concat_batches(batches: list[dict], pad_token_id: int) -> dict:
    """One scored batch from several rounds of TRL's `_generate_and_score_completions` output.

    Prompts are left-padded and completion-aligned tensors right-padded to the widest round (ids with
    `pad_token_id`, `tool_mask` with 1 as TRL does, IS ratios with 1, masks/log-probs/advantages with 0), rows
    are stacked in round order; `num_items_in_batch` is summed (the filter recomputes it over kept rows).
    """
    if [set(b) for b in batches].count(set(batches[0])) != len(batches):
        raise ValueError("dynamic sampling rounds returned batches with different keys")
    return {key: _merge(key, [b[key] for b in batches], pad_token_id) for key in batches[0]}


class DynamicSampler:
    """Trainer glue: score rounds until `target` informative groups (all ranks) or the cap, then filter.

    Every rank runs the same number of rounds: the informative count comes from rewards TRL has already
    gathered over all ranks, and one `gather` per round also agrees on whether every rank still had data.
    The trainer hands in narrow pieces: `score_round(inputs) -> (output, zero-signal rows of all ranks)`,
    `drop_rows(output, keep) -> output`, its all-rank `gather`, the epoch's `stream` (a GenerationBatchStream,
    shared with selective rollout) and its train `metrics` (name -> list).
    """

    def __init__(
        self, *, score_round, drop_rows, gather, rank: int, pad_token_id: int, group_size: int, target: int,
        max_rounds: int, on_cap: str, stream: GenerationBatchStream, metrics,
    ):  # fmt: skip
        self.score_round, self.drop_rows, self.gather, self.metrics = score_round, drop_rows, gather, metrics
        self.rank, self.pad_token_id, self.group_size = rank, pad_token_id, group_size
        self.target, self.max_rounds, self.on_cap = target, max_rounds, on_cap
        self.stream = stream

    @classmethod
    def from_config(
        cls, args, *, group_size: int, num_processes: int, pad_to_multiple_of: int | None, **wiring
    ) -> DynamicSampler:
        """A sampler with the `dynamic_sampling_*` fields of `args` (a GRPOHubConfig) and the trainer's `wiring`; its
        selected rows are kept by `filtering.drop_rows` (padded to the row count all ranks agree on)."""
        drop_rows = functools.partial(
            filtering.drop_rows,
            gather=wiring["gather"],
            steps_per_generation=args.steps_per_generation,
            num_processes=num_processes,
            pad_to_multiple_of=pad_to_multiple_of,
            metrics=wiring["metrics"],
        )
        return cls(
            group_size=group_size,
            target=args.dynamic_sampling_target_groups or args.generation_batch_size // group_size,
            max_rounds=args.dynamic_sampling_max_rounds,
            on_cap=args.dynamic_sampling_on_cap,
            drop_rows=drop_rows,
            **wiring,
        )

    def _next_inputs(self):
        """The next generation batch on this rank, or None on every rank if any rank has none."""
        inputs = self.stream.next_batch()
        have = self.gather(torch.tensor([inputs is not None]))
        return inputs if bool(have.all()) else None

    def collect(self, inputs) -> dict:
        """Score `inputs`, refill while short of the target, keep the first `target` informative groups."""
        outputs, informative, local_rows, exhausted = [], [], [], False
        while True:
            output, zero = self.score_round(inputs)
            outputs.append(output)
            local_rows.append(len(output["advantages"]))  # this rank's rows scored (shrunk: fewer)
            informative.append(informative_groups(zero, self.group_size))
            found = int(sum(int(groups.sum()) for groups in informative))
            if found >= self.target or len(outputs) > self.max_rounds:
                break
            inputs = self._next_inputs()
            if inputs is None:
                exhausted = True
                break
        if found < self.target and self.on_cap == "error":
            raise RuntimeError(
                f"dynamic sampling found {found} informative groups in {len(outputs)} generation batches, fewer "
                f"than dynamic_sampling_target_groups={self.target}. Fix: raise dynamic_sampling_max_rounds, lower "
                "the target, use easier prompts, or set dynamic_sampling_on_cap='train'."
            )
        kept = select_groups(informative, self.target)
        keep = torch.cat(
            [
                rank_rows(groups, self.group_size, self.rank, rows)
                for groups, rows in zip(kept, local_rows, strict=True)
            ]
        )
        merged = concat_batches(outputs, self.pad_token_id)
        result = self.drop_rows(merged, keep.to(merged["advantages"].device))
        self._log(len(outputs) - 1, informative, kept, exhausted)
        return result

    def _log(self, rounds: int, informative, kept, exhausted: bool) -> None:
        generated = sum(groups.numel() for groups in informative)
        kept_groups = sum(int(groups.sum()) for groups in kept)
        metrics = self.metrics
        metrics["dynamic_sampling/rounds"].append(float(rounds))
        metrics["dynamic_sampling/informative_frac"].append(
            sum(int(g.sum()) for g in informative) / generated
        )
        metrics["dynamic_sampling/rows_generated"].append(float(generated * self.group_size))
        metrics["dynamic_sampling/rows_trained"].append(float(kept_groups * self.group_size))
        metrics["dynamic_sampling/cap_hit"].append(float(kept_groups < self.target))
        metrics["dynamic_sampling/data_exhausted"].append(float(exhausted))
