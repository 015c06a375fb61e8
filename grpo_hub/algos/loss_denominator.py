"""The loss denominator: what the summed loss terms of one micro-batch are divided by. Decided here only.

Both loss paths call `micro_batch_denominator`: the own path divides its summed terms by it, and TRL's built-in
losses are rescaled from TRL's own denominator (the same function without filtering counts) to it.
Pure torch; the cross-rank counts are gathered by the caller (`grpo_hub.training.filtering.drop_rows`).
"""

from __future__ import annotations

import torch

from grpo_hub.algos.loss_types import BATCH_TOKENS, DENOMINATORS, MICRO_TOKENS, ROWS

MIN_ROWS_PER_STEP = 1e-8  # an all-filtered batch trains zero-loss pad rows: keep the division finite
# micro_batch_denominator argument <- key of the scored batch (0-dim values; the last three only under filtering)
BATCH_COUNT_KEYS = {
    "batch_tokens": "num_items_in_batch",
    "kept_rows": "kept_rows",
    "all_rows": "all_rows",
    "all_tokens": "all_items_in_batch",
}


def batch_counts(batch: dict) -> dict:
    """The generation-batch counts of a (micro-)batch as `micro_batch_denominator` keyword arguments (None if absent)."""
    return {arg: batch.get(key) for arg, key in BATCH_COUNT_KEYS.items()}


def micro_batch_denominator(
    kind: str,
    *,
    train: bool,
    accumulation_steps: int,
    num_processes: int = 1,
    steps_per_generation: int = 1,
    micro_rows: float | torch.Tensor | None = None,
    micro_tokens: float | torch.Tensor | None = None,
    batch_tokens: float | torch.Tensor | None = None,
    filtering: str | None = None,
    kept_rows: float | torch.Tensor | None = None,
    all_rows: float | torch.Tensor | None = None,
    all_tokens: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Denominator D of one micro-batch: its loss is (sum of its per-row or per-token loss terms) / D.

    A = `accumulation_steps` in training (TRL's `current_gradient_accumulation_steps`: micro-batches summed into
    one optimizer step), 1 in eval (no accumulation, no split). P = `num_processes`, S = `steps_per_generation`.

    - ROWS (`loss_types.ROWS`: grpo, gspo, sapo, dr_grpo, luspo, seq-mean agg modes; a per-row term summed):
        no filtering:           D = R · A, R = `micro_rows` (the rows the mean runs over)
        filtering 'kept':       D = max(kept_rows / (S·P), 1e-8) · A   (rows trained per micro-step, DAPO-style)
        filtering 'all':        D = max(all_rows / (S·P), 1e-8) · A    (rows before dropping: TRL's gradient)
      Rows per micro-step, not the micro-batch's own row count, so pad rows added by filtering never dilute
      the mean and packing (moving rows between micro-steps) leaves the gradient unchanged.
    - MICRO_TOKENS (bnpo): D = max(micro_tokens, 1) · A, with or without filtering (packing is refused).
    - BATCH_TOKENS (dapo, cispo, vespo, token-mean agg mode; TRL 1.16 `_compute_loss`):
        train: D = max(N, 1) / P · A / S;   eval: D = max(N, 1) / P
        N = `batch_tokens` (`num_items_in_batch`: loss tokens of the generation batch on all ranks; after
        filtering, of the kept rows) without filtering or with 'kept', N = `all_tokens` (before dropping) with 'all'.
      N / P / S is the loss tokens of one micro-step on one rank on average, so the loss does not depend on how
      rows fall into micro-batches.
    `filtering` is None (no zero-signal filtering, or eval: rows are only dropped in training), 'kept' or 'all'
    (`zero_signal_normalizer`); `kept_rows` / `all_rows` / `all_tokens` are generation-batch counts over all ranks.
    Returns a 0-dim tensor (float unless the inputs are integer tensors).
    """
    accumulation = accumulation_steps if train else 1
    if filtering not in (None, "kept", "all"):
        raise ValueError(f"filtering must be None, 'kept' or 'all', got {filtering!r}")
    if kind == ROWS:
        if filtering is None:
            rows = torch.as_tensor(micro_rows)
        else:
            rows = torch.as_tensor(kept_rows if filtering == "kept" else all_rows)
            rows = (rows / (steps_per_generation * num_processes)).clamp(min=MIN_ROWS_PER_STEP)
        return rows * accumulation
    if kind == MICRO_TOKENS:
        return torch.as_tensor(micro_tokens).clamp(min=1.0) * accumulation
    if kind == BATCH_TOKENS:
        tokens = torch.as_tensor(all_tokens if filtering == "all" else batch_tokens)
        denominator = tokens.clamp(min=1.0) / num_processes
        if train:
            denominator = denominator * accumulation / steps_per_generation
        return denominator
    raise ValueError(f"kind must be one of {DENOMINATORS}, got {kind!r}")
