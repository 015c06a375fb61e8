"""Shared-prompt layout: each prompt of a micro-batch computed once for all its rows, and the attention that keeps every
row's view of its tokens what it is in TRL's padded rows.

A GRPO group is one prompt and its completions; TRL's forwards (and `padding_free`'s bins) compute the prompt once per
completion. Here the rows whose real prompt tokens are equal (same ids where the attention mask is 1, same mask: a
micro-batch is shuffled by TRL, so rows are grouped by their tokens, never by position; ragged groups need nothing more)
form one unit laid out as

    p[0] ... p[P-2] | p[P-1] c1[0] ... c1[C1-1] | p[P-1] c2[0] ... | ...
    positions 0..P-2 | P-1, P, ..., P-1+C1        | P-1, P, ...      |
    shared prefix    | row 1's branch             | row 2's branch

The prompt's last token heads every branch: its output scores the branch's first completion token through the model's
own LM head (so its logit processing, temperature and entropy are untouched), at the cost of G - 1 extra tokens per
group instead of G - 1 extra prompts. A token attends a key of its own unit iff the key is not after it in the bin and
is in the shared prefix or in its own branch (`attention_allowed`): each branch token then sees exactly its row's real
tokens up to itself, at the row's own position ids, as in the padded row (verl RFC #6401 and TRL's `TreeRow` share
prefixes the same way; the mask here is the prefix tree of depth one). Gradients into the shared prefix sum over the
group's branches, as they would over G copies. Units go into bins with even loads (`padding_free.balanced_bins`); a
bin's tail is its own sequence of pad tokens. Pure torch.
"""

import math
from dataclasses import dataclass

import torch

from grpo_hub.algos.filtering import take_rows
from grpo_hub.algos.packing import concat_micro_batches
from grpo_hub.algos.padding_free import IGNORE, PackedRows, balanced_bins, bin_count

TAIL = -1  # `sequence` of a bin's unused tail


@dataclass(frozen=True)
class SharedPrompts(PackedRows):
    """`PackedRows` (`padding_free.unpack` reads it back to TRL's layout) whose bins hold units of one prompt and its
    rows' branches. `sequence` (bins, width): the unit a slot belongs to (TAIL for a bin's tail); `branch`: 0 for a
    unit's shared prefix and the tail, r + 1 for row r's branch. `real_tokens` counts the slots that hold a token (the
    tokens computed, but the tails); `row_tokens` the rows' real tokens (what `padding_free.pack_rows` computes)."""

    sequence: torch.Tensor
    branch: torch.Tensor
    row_tokens: int
    units: int  # prompts laid out (groups with a scored token)


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> torch.Tensor:
    """Each row's group, numbered 0, 1, ... in order of first appearance: rows are in one group iff their first
    `prompt_width` columns have equal ids where the mask is 1 and an equal mask."""
    if prompt_width == 0 or input_ids.size(0) == 0:
        return torch.zeros(input_ids.size(0), dtype=torch.long, device=input_ids.device)
    prompt = input_ids[:, :prompt_width].masked_fill(attention_mask[:, :prompt_width] == 0, -1)
    _, inverse = torch.unique(prompt, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), input_ids.size(0), dtype=torch.long, device=inverse.device)
    first.scatter_reduce_(0, inverse, torch.arange(input_ids.size(0), device=inverse.device), reduce="amin")
    rank = torch.empty_like(first)
    rank[first.argsort()] = torch.arange(first.numel(), device=first.device)
    return rank[inverse]


def exchange_block(steps_per_generation: int, accumulation_steps: int) -> int:
    """How many consecutive micro-batches (slots) of TRL's buffered generation batch always train in the same optimizer
    step: gcd(steps_per_generation, accumulation_steps). Micro-step p trains slot p mod steps_per_generation and an
    optimizer step ends after micro-steps that are multiples of accumulation_steps (counted from an epoch's start,
    itself a multiple of steps_per_generation; a resumed run starts on a step's end), so a step's end falls at a slot
    offset that is a multiple of the gcd: blocks of that many slots never straddle one, on any pass over the buffer.
    Rows moved only inside a block keep their optimizer step, so a loss that does not depend on which micro-step a
    row trains in gives the same update."""
    return math.gcd(steps_per_generation, accumulation_steps)


def whole_group_order(groups: torch.Tensor) -> torch.Tensor:
    """The row order that puts each group's rows next to each other: groups in order of their numbers (`prompt_groups`
    numbers them by first appearance, so TRL's shuffled group order is kept), a group's rows in their order."""
    return torch.argsort(groups, stable=True)


def whole_group_micro_batches(
    batches: list[dict], block: int, pad_to_multiple_of: int | None = None
) -> list[dict]:
    """TRL's buffered micro-batches (`batches`, in slot order) with the rows of each `block` consecutive ones
    (`exchange_block`) put in `whole_group_order` of their `prompt_groups`, then split again into micro-batches of
    the sizes they had, pad columns trimmed: a micro-batch holds whole groups where the sizes allow, instead of the
    rows TRL's shuffle gave it (about G / k of a group for k micro-batches)."""
    out = []
    for start in range(0, len(batches), block):
        part = batches[start : start + block]
        rows = concat_micro_batches(part)
        groups = prompt_groups(rows["prompt_ids"], rows["prompt_mask"], rows["prompt_ids"].shape[1])
        for index in whole_group_order(groups).split([b["prompt_ids"].shape[0] for b in part]):
            out.append(take_rows(rows, index, index.numel(), pad_to_multiple_of))
    return out


def pack_groups(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    bin_tokens: int,
    pad_token_id: int,
) -> SharedPrompts:
    """Lay out the rows of TRL's padded micro-batch `(rows, length)` (prompt columns, then `logits_to_keep`
    completion columns) as units of one prompt and its rows' branches (module docstring), in `balanced_bins` of about
    `bin_tokens` tokens (`bin_count` over the units' lengths).

    Scored tokens are TRL's (mask 1 in the completion columns), labelled as in `pack_rows`. A row with no scored token
    gets no branch, a group with none no unit. A scored token must follow a real prompt token of its row.
    """
    rows, length = input_ids.shape
    prompt_width = length - logits_to_keep
    device = input_ids.device
    mask = attention_mask.bool()
    prompt_len = mask[:, :prompt_width].sum(dim=1)
    completion_len = mask[:, prompt_width:].sum(dim=1)
    if bool(((prompt_len == 0) & (completion_len > 0)).any()):
        first = int(((prompt_len == 0) & (completion_len > 0)).nonzero()[0])
        raise ValueError(f"row {first} has a scored token with no real token before it (an empty prompt)")
    group = prompt_groups(input_ids, attention_mask, prompt_width)
    placed = completion_len > 0  # rows with a branch
    groups = int(group.max()) + 1 if rows else 0
    branch_len = torch.where(placed, completion_len + 1, 0)
    # unit g: its prompt's first P - 1 tokens (if any row of it is placed), then its placed rows' branches in row order
    unit_rows = [torch.nonzero(group == g).flatten() for g in range(groups)]
    leader = torch.tensor([int(r[0]) for r in unit_rows], dtype=torch.long)
    has_branch = [bool(placed[r].any()) for r in unit_rows]
    unit_len = [
        int(prompt_len[leader[g]] - 1 + branch_len[unit_rows[g]].sum()) if has_branch[g] else 0
        for g in range(groups)
    ]
    bins = balanced_bins(unit_len, bin_count(unit_len, bin_tokens))
    num_bins = max(len(bins), 1)
    width = max((sum(unit_len[g] for g in members) for members in bins), default=1)
    unit_bin = torch.zeros(groups, dtype=torch.long)
    unit_offset = torch.zeros(groups, dtype=torch.long)
    unit_number = torch.zeros(groups, dtype=torch.long)  # the unit's place within its bin
    branch_offset = torch.zeros(rows, dtype=torch.long)  # where row r's branch starts in its bin
    for number, members in enumerate(bins):
        start = 0
        for place, g in enumerate(members):
            unit_bin[g], unit_offset[g], unit_number[g] = number, start, place
            ends = start + int(prompt_len[leader[g]]) - 1 + torch.cumsum(branch_len[unit_rows[g]], 0)
            branch_offset[unit_rows[g]] = ends - branch_len[unit_rows[g]]
            start += unit_len[g]
    unit_bin, unit_offset, unit_number, branch_offset, leader = (
        t.to(device) for t in (unit_bin, unit_offset, unit_number, branch_offset, leader)
    )
    is_leader = torch.zeros(rows, dtype=torch.bool, device=device)
    is_leader[leader] = True
    row, column = mask.nonzero(as_tuple=True)
    index_in_row = (torch.cumsum(mask.long(), dim=1) - 1)[row, column]
    last_prompt = prompt_len[row] - 1
    in_prefix = is_leader[row] & torch.tensor(has_branch, dtype=torch.bool, device=device)[group[row]]
    in_prefix &= index_in_row < last_prompt
    in_branch = placed[row] & (index_in_row >= last_prompt)
    slot = torch.where(
        in_prefix, unit_offset[group[row]] + index_in_row, branch_offset[row] + index_in_row - last_prompt
    )
    take = in_prefix | in_branch
    row, column, index_in_row, slot = row[take], column[take], index_in_row[take], slot[take]
    flat = unit_bin[group[row]] * width + slot
    used = torch.zeros(num_bins, dtype=torch.long, device=device)
    used.index_add_(0, unit_bin[group[row]], torch.ones_like(row))
    tail = torch.arange(width, device=device).expand(num_bins, width) - used[:, None]
    packed_ids = torch.full((num_bins * width,), pad_token_id, dtype=input_ids.dtype, device=device)
    packed_ids[flat] = input_ids[row, column]
    positions = tail.clamp(min=0).reshape(-1).clone()
    positions[flat] = index_in_row
    sequence = torch.full((num_bins * width,), TAIL, dtype=torch.long, device=device)
    sequence[flat] = unit_number[group[row]]
    branch = torch.zeros(num_bins * width, dtype=torch.long, device=device)
    branch[flat] = torch.where(index_in_row >= last_prompt[take], row + 1, 0)
    labels = torch.full((num_bins * width,), IGNORE, dtype=input_ids.dtype, device=device)
    scored = column >= prompt_width
    labels[flat[scored]] = input_ids[row[scored], column[scored]]
    real = int(take.sum())
    return SharedPrompts(
        input_ids=packed_ids.view(num_bins, width),
        position_ids=positions.view(num_bins, width),
        labels=labels.view(num_bins, width),
        source=row[scored] * logits_to_keep + (column[scored] - prompt_width),
        target=unit_bin[group[row[scored]]] * (width - 1) + slot[scored] - 1,
        rows=rows,
        logits_to_keep=logits_to_keep,
        real_tokens=real,
        pad_tokens=num_bins * width - real,
        sequence=sequence.view(num_bins, width),
        branch=branch.view(num_bins, width),
        row_tokens=int(mask.sum()),
        units=sum(has_branch),
    )


def attention_allowed(packed: SharedPrompts, sliding_window: int | None = None) -> torch.Tensor:
    """The attention mask of `packed`'s bins, `(bins, 1, width, width)` bool, True where query q may read key k: both
    in one unit (or both in the bin's tail), k not after q, and k in the shared prefix or in q's own branch; with a
    `sliding_window` also position(q) - position(k) < window (transformers' `sliding_window_overlay`, read on the rows'
    own positions, as in the padded row). Every slot reads itself, so no softmax row is empty."""
    sequence, branch, position = packed.sequence, packed.branch, packed.position_ids
    width = sequence.size(1)
    index = torch.arange(width, device=sequence.device)
    allowed = (sequence[:, :, None] == sequence[:, None, :]) & (index[None, :] <= index[:, None])[None]
    allowed &= (branch[:, None, :] == 0) | (branch[:, None, :] == branch[:, :, None])
    if sliding_window is not None:
        allowed &= position[:, :, None] - position[:, None, :] < sliding_window
    return allowed[:, None]
