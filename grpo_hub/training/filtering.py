"""Zero-signal row dropping, on the trainer's side of filtering (the pure row arithmetic: `grpo_hub.algos.filtering`).

`drop_micro_batch_rows` runs after TRL's shuffle and split (filtering), `drop_rows` before it (dynamic sampling's
selection of groups). Both pad to a row count all ranks agree on and record the generation-batch counts the loss
denominator reads (`grpo_hub.algos.loss_denominator`).
"""

from collections.abc import Callable

import torch

from grpo_hub.algos import loss_types
from grpo_hub.algos.filtering import agreed_row_count, keep_rows, micro_step_row_counts

# (B,) bool key of a scored batch: rows of groups with signal; the others are dropped after TRL's split
SIGNAL_ROWS = "signal_rows"


def drop_micro_batch_rows(
    batches: list[dict],
    *,
    gather: Callable[[torch.Tensor], torch.Tensor],
    num_processes: int,
    pad_to_multiple_of: int | None,
    metrics: dict,
) -> list[dict]:
    """TRL's buffered micro-batches of one generation batch, each without its zero-signal rows (`SIGNAL_ROWS`).

    Rows never move between micro-batches, so each trains in the optimizer step TRL gives it. One all-gather of
    (kept rows, rows, kept loss tokens) per micro-batch; each micro-batch is padded to the row count all ranks agree
    on for it (`algos.filtering.micro_step_row_counts`). Records the generation-batch counts the denominator reads
    (`algos.loss_denominator.micro_batch_denominator`) in every micro-batch, deciding nothing: `num_items_in_batch` becomes
    the loss tokens of the kept rows (all ranks), `all_items_in_batch` keeps TRL's count, `kept_rows` / `all_rows`
    count rows over all ranks.
    """
    keeps = [b[SIGNAL_ROWS] for b in batches]
    local = torch.tensor(
        [
            [int(keep.sum()), keep.numel(), int((b["completion_mask"] * b.get("tool_mask", 1))[keep].sum())]
            for b, keep in zip(batches, keeps, strict=True)
        ],
        device=keeps[0].device,
    )
    counts = gather(local.unsqueeze(0)).view(num_processes, len(batches), 3).cpu()
    rows = micro_step_row_counts(counts[..., 0])
    kept_rows, all_rows, kept_tokens = (int(c) for c in counts.sum(dim=(0, 1)))
    all_tokens = batches[0]["num_items_in_batch"]
    scalars = {
        "num_items_in_batch": torch.tensor(kept_tokens, dtype=all_tokens.dtype, device=all_tokens.device),
        "all_items_in_batch": all_tokens,
        "kept_rows": torch.tensor(float(kept_rows), device=keeps[0].device),
        "all_rows": torch.tensor(float(all_rows), device=keeps[0].device),
    }
    out = []
    for batch, keep, num_rows in zip(batches, keeps, rows.tolist(), strict=True):
        batch = {k: v for k, v in batch.items() if k != SIGNAL_ROWS}
        out.append(keep_rows(batch, keep, num_rows, pad_to_multiple_of) | scalars)
    metrics["zero_signal/frac_rows_dropped"].append(1.0 - kept_rows / all_rows)
    metrics["zero_signal/rows_trained"].append(float(kept_rows))
    metrics["zero_signal/rows_padded"].append(float(int(rows.sum()) * num_processes - kept_rows))
    return out


def mark_signal_rows(output: dict, zero: torch.Tensor, rank: int) -> None:
    """Mark this rank's rows of a scored batch (`output`) that belong to groups with signal (`SIGNAL_ROWS`), from
    `zero`, the zero-signal mask of all ranks' rows; `drop_micro_batch_rows` drops the others after TRL's split."""
    rows = len(output["advantages"])  # this rank's rows (selective rollout may have shrunk them: fewer)
    output[SIGNAL_ROWS] = ~zero[rank * rows : (rank + 1) * rows]


def drop_from_new_buffer(before: list | None, buffered: list, picked: dict, **wiring) -> tuple[list, dict]:
    """TRL's buffered micro-batches and the one its `_prepare_inputs` picked from them, without the zero-signal rows
    when TRL has just shuffled, split and buffered a new generation batch (`buffered` is not `before`) with rows
    marked (`SIGNAL_ROWS`); unchanged otherwise: the same buffer, or dynamic sampling's batch (its rows were selected
    before the split). `wiring`: the keyword arguments of `drop_micro_batch_rows`."""
    if buffered is before or SIGNAL_ROWS not in picked:
        return buffered, picked
    position = next(i for i, batch in enumerate(buffered) if batch is picked)
    buffered = drop_micro_batch_rows(buffered, **wiring)
    return buffered, buffered[position]


def drop_rows(
    output: dict,
    keep: torch.Tensor,
    *,
    gather: Callable[[torch.Tensor], torch.Tensor],
    steps_per_generation: int,
    num_processes: int,
    pad_to_multiple_of: int | None,
    metrics: dict,
) -> dict:
    """Keep this rank's rows where `keep`, padded to the row count all ranks agree on (`algos.filtering`), before
    TRL's shuffle and split: dynamic sampling's selection of groups from several rounds.

    One all-gather of (kept rows, rows, kept loss tokens) per rank. Records the generation-batch counts the
    denominator reads (`algos.loss_denominator.micro_batch_denominator`), deciding nothing: `num_items_in_batch` becomes
    the loss tokens of the kept rows (all ranks); `all_items_in_batch` keeps TRL's count before dropping;
    `kept_rows` / `all_rows` count rows over all ranks. All are 0-dim, so TRL's split/shuffle hand them
    unchanged to every micro-batch.
    """
    loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
    counts = torch.tensor([int(keep.sum()), keep.numel(), int(loss_mask[keep].sum())], device=keep.device)
    counts = gather(counts).view(-1, 3)
    num_rows = agreed_row_count(int(counts[:, 0].max()), steps_per_generation)
    output = keep_rows(output, keep, num_rows, pad_to_multiple_of)
    kept_rows, all_rows, kept_tokens = (int(c) for c in counts.sum(dim=0))
    all_tokens = output["num_items_in_batch"]
    output["num_items_in_batch"] = torch.tensor(kept_tokens, dtype=all_tokens.dtype, device=all_tokens.device)
    output["all_items_in_batch"] = all_tokens
    output["kept_rows"] = torch.tensor(float(kept_rows), device=keep.device)
    output["all_rows"] = torch.tensor(float(all_rows), device=keep.device)
    metrics["zero_signal/frac_rows_dropped"].append(1.0 - kept_rows / all_rows)
    metrics["zero_signal/rows_trained"].append(float(kept_rows))
    metrics["zero_signal/rows_padded"].append(float(num_rows * num_processes - kept_rows))
    return output


def rescale_to_kept_rows(loss, inputs: dict, kind: str, denominator):
    """TRL's loss of a micro-batch whose zero-signal rows were dropped, moved from TRL's denominator to grpo_hub's.
    `kind`: `loss_denominator`; `denominator(inputs, kind, micro_count, filtered=...)`: the trainer's
    `micro_batch_denominator` of this micro-batch, whose mean ran over `micro_count` rows (ROWS) or loss tokens."""
    micro = inputs["prompt_ids"].shape[0] if kind == loss_types.ROWS else inputs["completion_mask"].sum()
    return loss * (denominator(inputs, kind, micro, filtered=False) / denominator(inputs, kind, micro))
