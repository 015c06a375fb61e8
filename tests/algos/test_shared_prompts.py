"""Shared-prompt layout (grpo_hub.algos.shared_prompts): rows grouped by their prompt tokens against a naive grouping,
and, read through the attention mask, every token's view of the bin equal to its padded row's real tokens up to it at
the row's own positions (with and without a sliding window); labels against TRL's; each prompt placed once. Whole
groups: the exchange block against a micro-step-by-micro-step simulation of TRL's buffer and transformers'
accumulation, and the re-split buffer against its rows."""

import itertools
import random

import pytest
import torch

from grpo_hub.algos.padding_free import IGNORE, unpack
from grpo_hub.algos.shared_prompts import (
    TAIL,
    attention_allowed,
    exchange_block,
    pack_groups,
    prompt_groups,
    whole_group_micro_batches,
)


def grouped_batch(rng, groups=None):
    """TRL's layout with repeated prompts: `groups` prompts (left-padded, at least one token) with 1-5 rows each
    (ragged), right-padded completions (possibly empty), rows shuffled, ids > 0; some prompts differ only in padding."""
    groups = groups or rng.randint(1, 5)
    prompt_width, completion_width = rng.randint(1, 7), rng.randint(1, 9)
    prompts = []
    for _ in range(groups):
        p = rng.randint(1, prompt_width)
        prompts.append([rng.randint(1, 3) for _ in range(p)])  # few ids: equal tails of unequal prompts occur
    rows = [
        (prompt, rng.randint(0, completion_width)) for prompt in prompts for _ in range(rng.randint(1, 5))
    ]
    rng.shuffle(rows)
    ids = torch.randint(1, 50, (len(rows), prompt_width + completion_width))
    mask = torch.zeros_like(ids)
    for r, (prompt, c) in enumerate(rows):
        ids[r, prompt_width - len(prompt) : prompt_width] = torch.tensor(prompt)
        mask[r, prompt_width - len(prompt) : prompt_width + c] = 1
    return ids, mask, completion_width


def real_tokens(ids, mask, r):
    return ids[r][mask[r].bool()].tolist()


def test_rows_are_grouped_by_equal_prompt_tokens_in_order_of_first_appearance():
    rng = random.Random(0)
    for _ in range(300):
        ids, mask, keep = grouped_batch(rng)
        width = ids.size(1) - keep
        keys = [tuple(ids[r, :width][mask[r, :width].bool()].tolist()) + tuple(mask[r, :width].tolist())
                for r in range(len(ids))]  # fmt: skip
        naive = {}
        expected = [naive.setdefault(key, len(naive)) for key in keys]
        assert prompt_groups(ids, mask, width).tolist() == expected


def views(packed, sliding_window=None):
    """For each slot holding a token: its branch and the (id, position) of every key it may read, in bin order."""
    allowed = attention_allowed(packed, sliding_window)[:, 0]
    out = []
    for b in range(packed.input_ids.size(0)):
        for q in range(packed.input_ids.size(1)):
            if packed.sequence[b, q] == TAIL:
                continue
            keys = allowed[b, q].nonzero().flatten().tolist()
            seen = [(int(packed.input_ids[b, k]), int(packed.position_ids[b, k])) for k in keys]
            out.append((b, q, int(packed.branch[b, q]), seen))
    return out


@pytest.mark.parametrize("window", [None, 1, 3])
def test_every_token_sees_exactly_its_rows_real_tokens_up_to_it(window):
    """The layout's contract: a branch token of row r at position i reads row r's real tokens 0..i (the last `window`
    of them) at positions 0..i, and nothing else; a prefix token reads its prompt's tokens up to it."""
    rng = random.Random(1)
    for _ in range(150):
        ids, mask, keep = grouped_batch(rng)
        packed = pack_groups(ids, mask, keep, rng.randint(1, 40), pad_token_id=0)
        rows = [real_tokens(ids, mask, r) for r in range(len(ids))]
        for _, _, branch, seen in views(packed, window):
            position = seen[-1][1]
            candidates = [rows[branch - 1]] if branch else [row for row in rows if len(row) > position]
            expected = [
                [(row[j], j) for j in range(position + 1)][-(window or position + 1) :] for row in candidates
            ]
            assert seen in expected  # a branch: its row's; the shared prefix: some row's prompt


def test_the_tail_reads_only_itself_and_every_slot_reads_itself():
    rng = random.Random(2)
    for _ in range(100):
        ids, mask, keep = grouped_batch(rng)
        packed = pack_groups(ids, mask, keep, rng.randint(1, 40), pad_token_id=0)
        allowed = attention_allowed(packed)[:, 0]
        assert bool(allowed.diagonal(dim1=1, dim2=2).all())
        tail = packed.sequence == TAIL
        assert not bool((allowed & (tail[:, :, None] != tail[:, None, :])).any())


def test_labels_are_trls_and_each_is_predicted_from_its_rows_previous_token():
    """TRL's labels (ids where the mask is 1 in the last `keep` columns) come back through the shift and `unpack`;
    the slot that predicts a row's token is that row's previous real token (the prompt's last for its first)."""
    rng = random.Random(3)
    for _ in range(300):
        ids, mask, keep = grouped_batch(rng)
        packed = pack_groups(ids, mask, keep, rng.randint(1, 40), pad_token_id=0)
        trl_labels = ids.masked_fill(mask == 0, 0)[:, -keep:]
        assert torch.equal(unpack(packed.labels[:, 1:].float(), packed), trl_labels.float())
        assert int((packed.labels != IGNORE).sum()) == int(mask[:, -keep:].sum())
        predicting = packed.input_ids[:, :-1].reshape(-1)[packed.target]
        previous = packed.position_ids[:, :-1].reshape(-1)[packed.target]
        branch = packed.branch[:, :-1].reshape(-1)[packed.target]
        rows = packed.source // keep
        columns = packed.source % keep + ids.size(1) - keep
        for k in range(len(rows)):
            row = real_tokens(ids, mask, int(rows[k]))
            index = int(mask[rows[k], : columns[k]].sum())  # the label's index among the row's real tokens
            assert int(branch[k]) == int(rows[k]) + 1
            assert (int(predicting[k]), int(previous[k])) == (row[index - 1], index - 1)


def test_each_prompt_is_placed_once_with_one_head_token_per_row():
    """Tokens computed: per group with a scored token, its prompt less its last token, and per row with a scored
    token, the prompt's last token and its completion; rows' real tokens are what padding-free computes."""
    rng = random.Random(4)
    for _ in range(200):
        ids, mask, keep = grouped_batch(rng)
        width = ids.size(1) - keep
        packed = pack_groups(ids, mask, keep, rng.randint(1, 40), pad_token_id=0)
        groups = prompt_groups(ids, mask, width)
        completion = mask[:, width:].sum(1)
        prompt = mask[:, :width].sum(1)
        expected = sum(int(prompt[groups == g][0]) - 1 for g in groups.unique().tolist()
                       if completion[groups == g].sum() > 0) + int((completion + 1)[completion > 0].sum())  # fmt: skip
        assert packed.real_tokens == expected
        assert packed.row_tokens == int(mask.sum())
        assert (
            packed.pad_tokens == packed.input_ids.numel() - expected == int((packed.sequence == TAIL).sum())
        )
        assert packed.units == len({int(groups[r]) for r in range(len(ids)) if completion[r] > 0})


def test_a_scored_token_without_a_prompt_is_refused():
    with pytest.raises(ValueError, match="empty prompt"):
        pack_groups(torch.tensor([[5, 6, 7]]), torch.tensor([[0, 1, 1]]), 2, 8, pad_token_id=0)


def test_rows_without_scored_tokens_compute_nothing():
    packed = pack_groups(torch.tensor([[4, 5], [4, 6]]), torch.tensor([[1, 0], [1, 0]]), 1, 8, pad_token_id=0)
    assert packed.real_tokens == 0 and packed.source.numel() == 0 and packed.units == 0
    assert torch.equal(unpack(torch.zeros(1, 0), packed), torch.zeros(2, 1))


def optimizer_steps_of_each_pass(
    spg: int, accum: int, num_iterations: int, epochs: int, batches: int
) -> list:
    """Naive: micro-step by micro-step, as TRL and transformers run them. An epoch is `batches` generation batches,
    each trained `num_iterations` passes of `spg` micro-steps (slot = micro-step mod spg); an optimizer step ends
    every `accum` micro-steps of an epoch and at its end. Per pass over a buffer: the optimizer step of each slot."""
    passes, step = [], 0
    for _ in range(epochs):
        in_step = 0
        for _ in range(batches * num_iterations):
            steps = []
            for _ in range(spg):
                steps.append(step)
                in_step += 1
                if in_step == accum:
                    step, in_step = step + 1, 0
            passes.append(steps)
        if in_step:  # the epoch's short last step
            step += 1
    return passes


@pytest.mark.parametrize("num_iterations", [1, 2, 3])
def test_an_exchange_block_never_straddles_an_optimizer_step_and_is_the_largest_that_does_not(num_iterations):
    for spg, accum, batches in itertools.product(range(1, 9), range(1, 9), (1, 3, 5)):
        passes = optimizer_steps_of_each_pass(spg, accum, num_iterations, epochs=3, batches=batches)

        def safe(block, passes=passes, spg=spg):
            return all(len(set(steps[i : i + block])) == 1 for steps in passes for i in range(0, spg, block))

        block = exchange_block(spg, accum)
        assert spg % block == 0 and safe(block), (spg, accum, block)
        larger = [b for b in range(block + 1, spg + 1) if spg % b == 0]
        if len(passes) * spg >= 2 * spg * accum:  # long enough to see every alignment
            assert not any(safe(b) for b in larger), (spg, accum, block)


def buffer(rng, micro_batches: int, rows_each: int) -> list[dict]:
    """TRL's buffer: `micro_batches` micro-batches of `rows_each` rows, the shuffled rows of ragged groups; each
    micro-batch trimmed to its own widths (as after filtering), a per-row advantage and a scalar."""
    ids, mask, completion_width = grouped_batch(rng, groups=rng.randint(1, 6))
    while ids.shape[0] < micro_batches * rows_each:
        ids, mask = torch.cat([ids, ids]), torch.cat([mask, mask])
    ids, mask = ids[: micro_batches * rows_each], mask[: micro_batches * rows_each]
    width = ids.shape[1] - completion_width
    batches = []
    for k in range(micro_batches):
        part = slice(k * rows_each, (k + 1) * rows_each)
        batches.append(
            {
                "prompt_ids": ids[part, :width], "prompt_mask": mask[part, :width],
                "completion_ids": ids[part, width:], "completion_mask": mask[part, width:],
                "advantages": torch.randn(rows_each), "num_items_in_batch": torch.tensor(7.0),
            }
        )  # fmt: skip
    return batches


def row_keys(batch: dict) -> list[tuple]:
    """Each row as its real prompt tokens, real completion tokens and advantage."""
    return [
        (tuple(batch["prompt_ids"][r][batch["prompt_mask"][r].bool()].tolist()),
         tuple(batch["completion_ids"][r][batch["completion_mask"][r].bool()].tolist()),
         float(batch["advantages"][r]))
        for r in range(batch["prompt_ids"].shape[0])
    ]  # fmt: skip


def test_whole_groups_keep_each_blocks_rows_and_sizes_and_put_each_prompts_rows_together():
    rng = random.Random(3)
    for _ in range(200):
        micro_batches, rows_each = rng.choice([(2, 4), (4, 4), (4, 2), (6, 3), (8, 8)])
        block = rng.choice([b for b in (1, 2, 3, 4, 8) if micro_batches % b == 0])
        batches = buffer(rng, micro_batches, rows_each)
        out = whole_group_micro_batches(batches, block)
        assert [b["prompt_ids"].shape[0] for b in out] == [rows_each] * micro_batches
        for start in range(0, micro_batches, block):
            before = [row for b in batches[start : start + block] for row in row_keys(b)]
            after = [row for b in out[start : start + block] for row in row_keys(b)]
            assert sorted(after) == sorted(before)  # the block's rows, each once, nothing else
            prompts = [row[0] for row in after]
            first_seen = list(dict.fromkeys(row[0] for row in before))
            assert list(dict.fromkeys(prompts)) == first_seen  # groups in TRL's shuffled order
            runs = [p for i, p in enumerate(prompts) if i == 0 or prompts[i - 1] != p]
            assert len(runs) == len(first_seen)  # each prompt's rows next to each other
            assert [row for row in after if row[0] == first_seen[0]] == [
                row for row in before if row[0] == first_seen[0]
            ]  # a group's rows in their order
        for b in out:
            assert b["num_items_in_batch"] == 7.0
            widest = int(b["completion_mask"].sum(dim=1).max())
            assert bool(b["prompt_mask"][:, 0].any()) and b["completion_mask"].shape[1] == max(
                widest, 1
            )  # trimmed
