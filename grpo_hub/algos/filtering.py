"""Row dropping for zero-signal filtering: keep some rows of TRL's scored batch, pad to an agreed count.

TRL's `_prepare_inputs` shuffles the batch returned by `_generate_and_score_completions` and splits it into
`steps_per_generation` micro-batches with a floor division, and every rank must run every micro-step with the
same row count (TRL all-gathers per-row metrics). Zero-signal filtering drops rows from each micro-batch AFTER
that shuffle and split (`micro_step_row_counts`), so every kept row trains in the optimizer step it trains in
under TRL and the shuffle draws a permutation of TRL's row count. Dynamic sampling selects groups from several
rounds before the split (`agreed_row_count`: the max kept, rounded up to a multiple of `steps_per_generation`).
Short ranks are padded with rows whose loss mask and advantage are zero. Completion columns that only pad rows
used are trimmed.
Packing the kept rows into fewer micro-steps is planned in `grpo_hub.algos.packing`. Pure torch; the cross-rank
max / all-gather is done by the caller.
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


def micro_step_row_counts(kept: torch.Tensor) -> torch.Tensor:
    """Rows every rank trains in each micro-step: (S,) from the (P, S) kept-row counts of P ranks' S micro-batches.

    Per micro-step, the max kept over ranks, at least 1 (every rank runs every micro-step with the same row count;
    an all-filtered micro-batch trains one zero-loss pad row). grpo_hub's own rule (docs/filtering.md).
    """
    if kept.ndim != 2:
        raise ValueError(f"kept must be (ranks, micro-steps), got shape {tuple(kept.shape)}")
    return kept.max(dim=0).values.clamp(min=1)


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
    kept = keep.nonzero().squeeze(1)
    if num_rows < kept.numel():
        raise ValueError(f"num_rows={num_rows} is smaller than the {kept.numel()} kept rows")
    index = torch.cat([kept, kept.new_zeros(num_rows - kept.numel())])
    return take_rows(batch, index, kept.numel(), pad_to_multiple_of)


def take_rows(
    batch: dict, index: torch.Tensor, real_rows: int, pad_to_multiple_of: int | None = None
) -> dict:
    """`batch`'s rows `index` (B,), in that order, pad columns trimmed; rows from `real_rows` on are pad rows
    (`ZEROED_ON_PAD` tensors set to zero). Values that are not row-aligned tensors pass through unchanged."""
    num_rows_in = batch["prompt_ids"].shape[0]
    is_pad = torch.arange(index.numel(), device=index.device) >= real_rows
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
