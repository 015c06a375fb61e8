"""Packing plan for zero-signal filtering: run fewer, fuller micro-steps once rows were dropped.

The kept rows of TRL's buffered micro-batches are moved into as few micro-steps of `per_device_train_batch_size`
rows as possible, without leaving their optimizer step (or their pass over the buffer), and the micro-steps left
empty run nothing. Row dropping itself is `grpo_hub.algos.filtering`; the state machine that follows the plan is
`grpo_hub.training.packing`. Pure torch; the all-gather of row counts is done by the caller.
"""

import math

import torch

from grpo_hub.algos.filtering import COMPLETION_KEYS

PROMPT_KEYS = ("prompt_ids", "prompt_mask")  # left-padded
COLUMN_FILL = {"tool_mask": 1, "importance_sampling_ratio": 1.0}  # others pad with 0 (masked out)


def cycle_segments(
    steps_per_generation: int, num_iterations: int, accumulation_steps: int, window_position: int
) -> list[range]:
    """Split the micro-steps of one generation cycle into segments whose rows may be packed together.

    A cycle is the `steps_per_generation * num_iterations` micro-steps that train one generation batch (TRL
    reuses its `steps_per_generation` buffered micro-batches `num_iterations` times). A segment ends at cycle
    position p when p is the buffer's last slot (p % steps_per_generation == steps_per_generation - 1) or the
    last micro-step of an optimizer step ((window_position + p + 1) % accumulation_steps == 0, where
    `window_position` counts the micro-steps of the current optimizer step already run when the cycle starts).
    Packing inside a segment keeps every row in the optimizer step and buffer pass it had in TRL's layout,
    and every micro-step that ends an optimizer step ends a segment (the cycle's end is also an epoch's).
    """
    cycle = steps_per_generation * num_iterations
    segments, start = [], 0
    for position in range(cycle):
        last_slot = position % steps_per_generation == steps_per_generation - 1
        if last_slot or (window_position + position + 1) % accumulation_steps == 0:
            segments.append(range(start, position + 1))
            start = position + 1
    return segments


def packed_step_count(rows_per_rank: list[int], batch_size: int) -> int:
    """Micro-steps a segment needs: ceil(max over ranks of its rows / batch_size), at least 1.

    At least one, so the segment's last micro-step (possibly the end of an optimizer step, where DDP
    reduces gradients and DeepSpeed steps) always runs a forward/backward on every rank.
    """
    return max(math.ceil(max(rows_per_rank) / batch_size), 1)


def packing_plan(
    rows: torch.Tensor, num_iterations: int, accumulation_steps: int, window_position: int, batch_size: int
) -> list[tuple[range, int, int, int] | None]:
    """Which micro-steps of a generation cycle run, and which rows each one trains, agreed by all ranks.

    `rows` is (ranks, steps_per_generation): the rows that carry loss in each buffered micro-batch of each
    rank (all ranks pass the same gathered tensor, so they compute the same plan). For every segment of
    `cycle_segments`, k = `packed_step_count` micro-steps run: the LAST k positions of the segment, so the
    micro-step that ends an optimizer step always runs. Entry p of the result is None (position p runs no
    forward/backward) or (slots, chunk, k, num_rows): train chunk `chunk` of k near-equal chunks
    (`packed_rows`) of the loss-carrying rows of buffer slots `slots`, concatenated in slot order, padded to
    num_rows = ceil(max rows over ranks / k) >= 1 rows on every rank (TRL gathers per-row metrics, which
    needs the same row count on every rank).
    """
    steps = rows.shape[1]
    plan: list[tuple[range, int, int, int] | None] = []
    for segment in cycle_segments(steps, num_iterations, accumulation_steps, window_position):
        slots = range(segment.start % steps, (segment.stop - 1) % steps + 1)
        per_rank = rows[:, slots.start : slots.stop].sum(dim=1).tolist()
        k = packed_step_count(per_rank, batch_size)
        num_rows = max(math.ceil(max(per_rank) / k), 1)
        plan += [None] * (len(segment) - k) + [(slots, chunk, k, num_rows) for chunk in range(k)]
    return plan


def packed_rows(num_rows: int, chunk: int, chunks: int) -> torch.Tensor:
    """Indices (into the segment's loss-carrying rows) of chunk `chunk` of `chunks` near-equal chunks."""
    return torch.tensor_split(torch.arange(num_rows), chunks)[chunk]


def _same_width(key: str, values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Prompt columns left-padded, completion columns right-padded to the widest micro-batch (masks 0 there)."""
    if values[0].ndim < 2 or (key not in PROMPT_KEYS and key not in COMPLETION_KEYS):
        return values
    width = max(v.shape[1] for v in values)
    out = []
    for v in values:
        pad = v.new_full((v.shape[0], width - v.shape[1], *v.shape[2:]), COLUMN_FILL.get(key, 0))
        out.append(torch.cat([pad, v] if key in PROMPT_KEYS else [v, pad], dim=1))
    return out


def concat_micro_batches(batches: list[dict]) -> dict:
    """Concatenate micro-batches of one generation batch along rows; other values come from the first.

    Micro-batches trimmed to different widths (zero-signal rows are dropped from each one) are padded to the
    widest first: prompts on the left, completions on the right, with masked-out columns."""
    first = batches[0]
    out = {}
    for key, value in first.items():
        row_aligned = isinstance(value, torch.Tensor) and value.ndim >= 1
        row_aligned = row_aligned and all(b[key].shape[0] == b["prompt_ids"].shape[0] for b in batches)
        out[key] = torch.cat(_same_width(key, [b[key] for b in batches])) if row_aligned else value
    return out
