"""Row dropping for zero-signal filtering: keep some rows of TRL's scored batch, pad to an agreed count.

TRL's `_prepare_inputs` splits the batch returned by `_generate_and_score_completions` into
`steps_per_generation` micro-batches with a floor division, and every rank must run every micro-step.
So each rank keeps its signal rows, all ranks agree on one row count (the max kept, rounded up to a
multiple of `steps_per_generation`, at least one row per micro-step), and short ranks are padded with
rows whose loss mask and advantage are zero. Completion columns that only pad rows used are trimmed.
Packing (`packing_plan`): the kept rows of the buffered micro-batches are then moved into as few micro-steps
of `per_device_train_batch_size` rows as possible, without leaving their optimizer step, and the micro-steps
left empty run nothing. Pure torch; the cross-rank max / all-gather is done by the caller.
"""

import math

import torch

# Row-aligned tensors whose last dimension is the completion length.
COMPLETION_KEYS = (
    "completion_ids",
    "completion_mask",
    "tool_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "advantages",  # (B, T) when per-token (grpo_hub.training.turns); a (B,) vector is left alone
)
# Row-aligned tensors that are zeroed on pad rows (no attention to pad completions, no loss, no signal).
ZEROED_ON_PAD = ("completion_mask", "tool_mask", "advantages")


def agreed_row_count(max_kept: int, steps_per_generation: int) -> int:
    """Rows every rank trains: max kept over ranks, rounded up to a multiple of steps, >= steps."""
    steps = steps_per_generation
    return max(math.ceil(max_kept / steps), 1) * steps


def _trimmed_length(mask: torch.Tensor, multiple: int | None) -> int:
    """Completion columns up to the last one any row attends to (>= 1), rounded up to `multiple`."""
    used = mask.any(dim=0).nonzero()
    length = int(used.max()) + 1 if used.numel() else 1
    if multiple:
        length = min(math.ceil(length / multiple) * multiple, mask.shape[1])
    return length


def _leading_pad_columns(prompt_mask: torch.Tensor, multiple: int | None) -> int:
    """Left-padding prompt columns that no row attends to, rounded down to `multiple`."""
    used = prompt_mask.any(dim=0).nonzero()
    first = int(used.min()) if used.numel() else prompt_mask.shape[1] - 1
    return first - first % multiple if multiple else first


def keep_rows(batch: dict, keep: torch.Tensor, num_rows: int, pad_to_multiple_of: int | None = None) -> dict:
    """Return `batch` with the rows where `keep` is True, padded to `num_rows`, pad columns trimmed.

    `keep` is a bool (B,) over the rows of `batch`; `num_rows` >= keep.sum(). Pad rows copy the first row
    (any row gives a valid forward) with `ZEROED_ON_PAD` tensors set to zero. Values that are not
    row-aligned tensors (scalars such as `num_items_in_batch`) pass through unchanged.
    """
    num_rows_in = keep.shape[0]
    kept = keep.nonzero().squeeze(1)
    if num_rows < kept.numel():
        raise ValueError(f"num_rows={num_rows} is smaller than the {kept.numel()} kept rows")
    index = torch.cat([kept, kept.new_zeros(num_rows - kept.numel())])
    is_pad = torch.arange(num_rows, device=keep.device) >= kept.numel()
    out = {}
    for key, value in batch.items():
        if not (isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == num_rows_in):
            out[key] = value
            continue
        value = value[index.to(value.device)]
        if key in ZEROED_ON_PAD:
            pad = is_pad.to(value.device).view(-1, *([1] * (value.ndim - 1)))
            value = value.masked_fill(pad, 0)
        out[key] = value
    length = _trimmed_length(out["completion_mask"].bool(), pad_to_multiple_of)
    for key in COMPLETION_KEYS:
        value = out.get(key)
        if isinstance(value, torch.Tensor) and value.ndim == 2 and value.shape[1] > 1:
            out[key] = value[:, :length]
    start = _leading_pad_columns(out["prompt_mask"].bool(), pad_to_multiple_of)
    out["prompt_ids"], out["prompt_mask"] = out["prompt_ids"][:, start:], out["prompt_mask"][:, start:]
    return out


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


def concat_micro_batches(batches: list[dict]) -> dict:
    """Concatenate micro-batches of one generation batch along rows; other values come from the first."""
    first = batches[0]
    num_rows = first["prompt_ids"].shape[0]
    out = {}
    for key, value in first.items():
        row_aligned = isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == num_rows
        out[key] = torch.cat([b[key] for b in batches]) if row_aligned else value
    return out
