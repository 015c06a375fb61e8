"""Pure parts of grpo_hub.training.dynamic_sampling: group selection, rank slices, batch concatenation, the batch stream."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_hub.training.dynamic_sampling import (
    GenerationBatchStream,
    concat_batches,
    informative_groups,
    rank_rows,
    select_groups,
)


def test_informative_groups_reads_one_flag_per_group():
    zero_rows = torch.tensor([True, True, False, False, True, True])
    assert informative_groups(zero_rows, 2).tolist() == [False, True, False]


def test_select_groups_keeps_the_first_target_informative_groups_in_round_order():
    rounds = [torch.tensor([False, True, False]), torch.tensor([True, True, True]), torch.tensor([True])]
    kept = select_groups(rounds, target=3)
    assert [k.tolist() for k in kept] == [[False, True, False], [True, True, False], [False]]


def test_select_groups_keeps_everything_informative_when_short_of_the_target():
    rounds = [torch.tensor([True, False]), torch.tensor([False, True])]
    assert [k.tolist() for k in select_groups(rounds, target=5)] == [[True, False], [False, True]]


def test_rank_rows_slices_the_kept_groups_rows_of_one_rank():
    kept = torch.tensor([True, False, True, True])  # 4 groups of 2 rows on 2 ranks: 4 rows each
    assert rank_rows(kept, 2, rank=0, rows_per_rank=4).tolist() == [True, True, False, False]
    assert rank_rows(kept, 2, rank=1, rows_per_rank=4).tolist() == [True, True, True, True]


def scored(prompt_width: int, completion_width: int, rows: int, start: int) -> dict:
    ids = torch.arange(start, start + rows * completion_width).view(rows, completion_width)
    return {
        "prompt_ids": torch.full((rows, prompt_width), 7),
        "prompt_mask": torch.ones(rows, prompt_width, dtype=torch.long),
        "completion_ids": ids,
        "completion_mask": torch.ones(rows, completion_width, dtype=torch.long),
        "tool_mask": torch.zeros(rows, completion_width, dtype=torch.long),
        "old_per_token_logps": torch.full((rows, completion_width), -1.0),
        "importance_sampling_ratio": torch.full((rows, 1), 0.5),
        "advantages": torch.arange(rows, dtype=torch.float) + start,
        "num_items_in_batch": torch.tensor(rows * completion_width),
    }


def test_concat_batches_pads_prompts_left_and_completions_right():
    merged = concat_batches([scored(2, 3, 1, 0), scored(3, 1, 2, 100)], pad_token_id=0)
    assert merged["prompt_ids"].tolist() == [[0, 7, 7], [7, 7, 7], [7, 7, 7]]
    assert merged["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1], [1, 1, 1]]
    assert merged["completion_ids"].tolist() == [[0, 1, 2], [100, 0, 0], [101, 0, 0]]
    assert merged["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert merged["tool_mask"].tolist() == [[0, 0, 0], [0, 1, 1], [0, 1, 1]]  # TRL pads tool_mask with 1
    assert merged["old_per_token_logps"][1].tolist() == [-1.0, 0.0, 0.0]
    assert merged["importance_sampling_ratio"].tolist() == [[0.5], [0.5], [0.5]]  # sequence-level: no padding
    assert merged["advantages"].tolist() == [0.0, 100.0, 101.0]
    assert merged["num_items_in_batch"].item() == 3 + 2


def test_concat_batches_rejects_rounds_that_disagree():
    with pytest.raises(ValueError, match="different keys"):
        concat_batches([scored(1, 1, 1, 0), {"prompt_ids": torch.zeros(1, 1)}], pad_token_id=0)
    first, second = scored(1, 1, 1, 0), scored(1, 1, 1, 0)
    first["rows_per_step"], second["rows_per_step"] = torch.tensor(1.0), torch.tensor(2.0)
    with pytest.raises(ValueError, match="rows_per_step"):
        concat_batches([first, second], pad_token_id=0)


def simulate(period: int, grad_accum: int, refills: list[int], n_batches: int) -> list[int]:
    """Transformers + TRL reading a RepeatSampler stream, with `refills[k]` extra batches at generation k.

    Items are (batch id, repeat index); TRL generates on micro-steps that are multiples of `period` from the
    item it was handed, and every batch it or the stream generates must start a batch (repeat index 0).
    """
    items = iter([(b, r) for b in range(n_batches) for r in range(period)])
    stream, generated, micro_step = GenerationBatchStream(period), [], 0
    while True:
        pulled = [item for _, item in zip(range(grad_accum), items, strict=False)]
        if not pulled:
            return generated
        stream.note_pulled(items, len(pulled))
        for batch, repeat in pulled:
            if micro_step % period == 0:
                assert repeat == 0, "TRL would generate from a repeat of an already used batch"
                generated.append(batch)
                for _ in range(refills[len(generated) % len(refills)]):
                    extra = stream.next_batch()
                    if extra is None:
                        break
                    assert extra[1] == 0
                    generated.append(extra[0])
            micro_step += 1


@settings(max_examples=60, deadline=None)
@given(
    spg=st.integers(1, 4),
    iterations=st.integers(1, 2),
    accum_factor=st.sampled_from([(1, 1), (2, 1), (1, 2), (3, 1)]),
    refills=st.lists(st.integers(0, 3), min_size=1, max_size=4),
)
def test_stream_uses_every_generation_batch_exactly_once(spg, iterations, accum_factor, refills):
    """No prompt lost or repeated: each batch of the epoch is generated once, by TRL or by a refill round."""
    period = spg * iterations
    grad_accum = spg * accum_factor[0] // accum_factor[1] if spg % accum_factor[1] == 0 else spg
    generated = simulate(period, grad_accum, refills, n_batches=12)
    assert sorted(generated) == list(range(12))


def test_stream_returns_none_when_the_epoch_is_exhausted():
    stream = GenerationBatchStream(period=2)
    assert stream.next_batch() is None  # no epoch iterator seen yet
    items = iter([("a", 0), ("a", 1), ("b", 0), ("b", 1)])
    stream.note_pulled(items, 0)
    assert stream.next_batch() == ("a", 0)
    assert stream.next_batch() == ("b", 0)
    assert stream.next_batch() is None
