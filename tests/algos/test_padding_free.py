"""Padding-free layout (grpo_hub.algos.padding_free): bins against a naive first-fit-decreasing, the packed rows
against a token-by-token reading of TRL's padded layout, and the way back against TRL's labels."""

import itertools
import random

import pytest
import torch

from grpo_hub.algos.padding_free import IGNORE, balanced_bins, bin_count, pack_rows, unpack


def random_padded_batch(rng, rows=None):
    """TRL's layout: left-padded prompts (at least one token), right-padded completions (possibly empty), ids > 0."""
    rows = rows or rng.randint(1, 12)
    prompt_width, completion_width = rng.randint(1, 9), rng.randint(1, 12)
    ids = torch.randint(1, 50, (rows, prompt_width + completion_width))
    mask = torch.zeros_like(ids)
    for r in range(rows):
        p, c = rng.randint(1, prompt_width), rng.randint(0, completion_width)
        mask[r, prompt_width - p : prompt_width + c] = 1
    return ids, mask, completion_width


def brute_force_fullest(lengths, count):
    """The smallest possible fullest load of `count` bins (every assignment tried)."""
    return min(
        max(sum(n for n, b in zip(lengths, choice, strict=True) if b == k) for k in range(count))
        for choice in itertools.product(range(count), repeat=len(lengths))
    )


def loads(lengths, bins):
    return [sum(lengths[i] for i in members) for members in bins]


def test_balanced_bins_hold_every_row_once_within_lpts_bound_of_the_optimum():
    rng = random.Random(1)
    for _ in range(300):
        lengths = [rng.randint(1, 30) for _ in range(rng.randint(1, 8))]
        count = rng.randint(1, 3)
        bins = balanced_bins(lengths, count)
        assert sorted(i for members in bins for i in members) == list(range(len(lengths)))
        assert len(bins) == min(count, len(lengths))
        optimum = brute_force_fullest(lengths, min(count, len(lengths)))
        assert max(loads(lengths, bins)) <= (4 / 3 - 1 / (3 * len(bins))) * optimum


def test_balanced_bins_leave_no_move_or_swap_that_lowers_the_fullest_bin():
    rng = random.Random(2)
    for _ in range(200):
        lengths = [rng.choice([0, rng.randint(1, 64)]) for _ in range(rng.randint(1, 70))]
        bins = balanced_bins(lengths, rng.randint(1, 20))
        load = loads(lengths, bins)
        full = max(range(len(bins)), key=lambda b: (load[b], -b)) if bins else None
        for other in range(len(bins)):
            for out in bins[full] if other != full else []:
                for into in [None, *bins[other]]:
                    shift = lengths[out] - (0 if into is None else lengths[into])
                    assert not (shift > 0 and max(load[full] - shift, load[other] + shift) < load[full])
        assert sorted(i for members in bins for i in members) == [i for i, n in enumerate(lengths) if n > 0]


def test_bin_count_aims_at_the_target_or_twice_the_longest_row():
    assert bin_count([10] * 64, 128) == 5  # 640 tokens / 128
    assert bin_count([100, 10, 10], 128) == 1  # 120 / max(128, 200)
    assert bin_count([300] * 4, 128) == 2  # 1,200 / 600
    assert bin_count([0, 0], 128) == bin_count([], 128) == 1


def test_packed_rows_hold_each_rows_real_tokens_in_order_with_their_own_positions():
    rng = random.Random(2)
    for _ in range(300):
        ids, mask, keep = random_padded_batch(rng)
        packed = pack_rows(ids, mask, keep, rng.randint(1, 64), pad_token_id=0)
        seen = []  # each packed sequence: a run of positions 0, 1, 2, ...
        for bin_ids, positions in zip(packed.input_ids.tolist(), packed.position_ids.tolist(), strict=True):
            for token, position in zip(bin_ids, positions, strict=True):
                if position == 0:
                    seen.append([])
                assert position == len(seen[-1])
                seen[-1].append(token)
        rows = [ids[r][mask[r].bool()].tolist() for r in range(len(ids))]
        real = [s for s in seen if any(s)]  # the bins' tails are sequences of pad id 0 (ids are > 0)
        assert sorted(real) == sorted(r for r in rows if r)
        assert packed.real_tokens == int(mask.sum())
        assert (
            packed.pad_tokens
            == packed.input_ids.numel() - packed.real_tokens
            == sum(len(s) for s in seen if not any(s))
        )


def test_labels_score_trls_tokens_and_unpack_returns_trls_layout():
    """TRL's labels: ids where the mask is 1 in the last `keep` columns. Reading the packed labels through the shift
    (position t is predicted at t - 1) and unpacking must give exactly those ids, and 0 where TRL masks."""
    rng = random.Random(3)
    for _ in range(300):
        ids, mask, keep = random_padded_batch(rng)
        packed = pack_rows(ids, mask, keep, rng.randint(1, 64), pad_token_id=0)
        shifted = packed.labels[:, 1:].float()  # the forward's outputs at t - 1 are about the label at t
        trl_labels = ids.masked_fill(mask == 0, 0)[:, -keep:].float()
        assert torch.equal(unpack(shifted, packed), trl_labels)
        assert int((packed.labels != IGNORE).sum()) == int(mask[:, -keep:].sum())


def test_unpack_is_differentiable_and_puts_nothing_on_unscored_positions():
    ids, mask, keep = random_padded_batch(random.Random(4), rows=6)
    packed = pack_rows(ids, mask, keep, 16, pad_token_id=0)
    values = torch.randn(packed.input_ids.shape[0], packed.input_ids.shape[1] - 1, requires_grad=True)
    unpack(values, packed).sum().backward()
    read = torch.zeros(values.numel())
    read[packed.target] = 1
    assert torch.equal(values.grad.reshape(-1), read)


def test_a_scored_token_without_a_prompt_is_refused():
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="empty prompt"):
        pack_rows(ids, torch.tensor([[0, 1, 1]]), 2, 8, pad_token_id=0)


def test_an_all_masked_batch_packs_into_one_empty_bin():
    packed = pack_rows(torch.tensor([[4, 5]]), torch.tensor([[0, 0]]), 1, 8, pad_token_id=0)
    assert packed.real_tokens == 0 and packed.source.numel() == 0
    assert torch.equal(unpack(torch.zeros(1, 0), packed), torch.zeros(1, 1))
