"""Padding-free layout: the real tokens of TRL's padded rows, packed into bins, and the way back.

TRL pads each micro-batch to its longest prompt (left) and longest completion (right) and runs the model over the whole
rectangle. Here each row's real tokens (attention mask 1, in order) are laid end to end in bins of about `bin_tokens`
tokens with even loads (`balanced_bins`), each row with its own position ids 0, 1, ..., so that attention stays inside a row
(transformers builds a block-diagonal causal mask from position ids that restart; verl `use_remove_padding`,
OpenRLHF `packing_samples`). A bin's unused tail holds `pad_token_id` at positions 0, 1, ... (a sequence of its own,
never scored). The per-token outputs of the packed forward go back to TRL's `(rows, logits_to_keep)` layout, 0 where
TRL's are masked. Pure torch.
"""

from dataclasses import dataclass

import torch

IGNORE = -100  # label of an unscored position (transformers' ignore index)
# transformers' attention implementations that read restarting position ids in a batch of several bins as separate
# rows (create_causal_mask's packed-sequence mask), tested here; flash attention reads packing from one row only
ATTENTION = ("sdpa", "eager")


def bin_count(lengths: list[int], target: int) -> int:
    """Bins of about max(`target`, 2 x the longest row) tokens: ceil(total / that), at least 1. Two rows or more per
    bin let the rows even the bins out."""
    return max(-(-sum(lengths) // max(target, 2 * max(lengths, default=0), 1)), 1)


def balanced_bins(lengths: list[int], count: int) -> list[list[int]]:
    """The rows of non-zero length in `count` bins (fewer if there are fewer rows) with even token loads, as lists of
    row indices; the bins are padded to the fullest, so its load is what is minimised.

    LPT (Graham 1969): each row, longest first (ties: lower index), into the least loaded bin (ties: lower bin); the
    fullest load is at most (4/3 - 1/(3 count)) of the optimum. Then, while one exists, the move of a row out of the
    fullest bin, or the swap of one of its rows with a shorter row of another bin, that leaves both bins below the
    fullest load, the one whose larger new load is smallest (ties: first found). Each step lowers the number of bins at
    the fullest load or the load itself, so it ends.
    """
    rows = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i))
    count = min(count, len(rows))
    bins, load = [[] for _ in range(count)], [0] * count
    for row in rows:
        target = min(range(count), key=lambda b: (load[b], b))
        bins[target].append(row)
        load[target] += lengths[row]
    while count > 1:
        full = max(range(count), key=lambda b: (load[b], -b))
        best = None  # (larger new load, other bin, row out, row in)
        for other in (b for b in range(count) if b != full):
            for out in bins[full]:
                for into in [None, *bins[other]]:
                    shift = lengths[out] - (0 if into is None else lengths[into])
                    new = max(load[full] - shift, load[other] + shift)
                    if shift > 0 and new < load[full] and (best is None or new < best[0]):
                        best = (new, other, out, into)
        if best is None:
            break
        _, other, out, into = best
        bins[full].remove(out)
        bins[other].append(out)
        if into is not None:
            bins[other].remove(into)
            bins[full].append(into)
        shift = lengths[out] - (0 if into is None else lengths[into])
        load[full], load[other] = load[full] - shift, load[other] + shift
    return bins


@dataclass(frozen=True)
class PackedRows:
    """A packed micro-batch: model inputs (`input_ids`, `position_ids`, `labels`, each `(bins, width)`) and the map
    back: the scored token at flat index `source[k]` of the `(rows, logits_to_keep)` layout is predicted at flat index
    `target[k]` of the packed forward's shifted `(bins, width - 1)` outputs."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    source: torch.Tensor
    target: torch.Tensor
    rows: int
    logits_to_keep: int
    real_tokens: int  # tokens of the rows
    pad_tokens: int  # slots of the bins that hold no row's token


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    bin_tokens: int,
    pad_token_id: int,
) -> PackedRows:
    """Pack the real tokens of `input_ids` `(rows, length)` into `balanced_bins` of about `bin_tokens` tokens
    (`bin_count`).

    Scored tokens are TRL's: attention mask 1 in the last `logits_to_keep` columns (TRL's labels). A scored token
    must follow a real token of its own row (a prompt of at least one token), or its prediction would read another row.
    """
    rows, length = input_ids.shape
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    row_lengths = lengths.tolist()
    bins = balanced_bins(row_lengths, bin_count(row_lengths, bin_tokens))
    width = max((int(lengths[b].sum()) for b in bins), default=1)
    bin_of = torch.zeros(rows, dtype=torch.long)
    offset = torch.zeros(rows, dtype=torch.long)
    for number, members in enumerate(bins):
        bin_of[members] = number
        member_lengths = lengths[members].cpu()
        offset[members] = torch.cumsum(member_lengths, 0) - member_lengths
    device = input_ids.device
    bin_of, offset = bin_of.to(device), offset.to(device)
    row, column = mask.nonzero(as_tuple=True)
    index_in_row = (torch.cumsum(mask.long(), dim=1) - 1)[row, column]
    slot = offset[row] + index_in_row
    flat = bin_of[row] * width + slot
    num_bins = max(len(bins), 1)
    used = torch.zeros(num_bins, dtype=torch.long, device=device).index_add_(0, bin_of, lengths)
    tail = torch.arange(width, device=device).expand(num_bins, width) - used[:, None]
    packed_ids = torch.full((num_bins * width,), pad_token_id, dtype=input_ids.dtype, device=device)
    packed_ids[flat] = input_ids[row, column]
    positions = tail.clamp(min=0).reshape(-1).clone()
    positions[flat] = index_in_row
    labels = torch.full((num_bins * width,), IGNORE, dtype=input_ids.dtype, device=device)
    scored = column >= length - logits_to_keep
    if bool((scored & (index_in_row == 0)).any()):
        first = int(row[scored & (index_in_row == 0)][0])
        raise ValueError(f"row {first} has a scored token with no real token before it (an empty prompt)")
    labels[flat[scored]] = input_ids[row[scored], column[scored]]
    source = row[scored] * logits_to_keep + (column[scored] - (length - logits_to_keep))
    target = bin_of[row[scored]] * (width - 1) + slot[scored] - 1
    return PackedRows(
        input_ids=packed_ids.view(num_bins, width),
        position_ids=positions.view(num_bins, width),
        labels=labels.view(num_bins, width),
        source=source,
        target=target,
        rows=rows,
        logits_to_keep=logits_to_keep,
        real_tokens=int(lengths.sum()),
        pad_tokens=num_bins * width - int(lengths.sum()),
    )


def unpack(per_token: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """The packed forward's shifted per-token values `(bins, width - 1)` in TRL's `(rows, logits_to_keep)` layout:
    the scored tokens' values, 0 elsewhere (as TRL's masked positions). Differentiable."""
    out = per_token.new_zeros(packed.rows * packed.logits_to_keep)
    out = out.index_put((packed.source,), per_token.reshape(-1)[packed.target])
    return out.view(packed.rows, packed.logits_to_keep)
