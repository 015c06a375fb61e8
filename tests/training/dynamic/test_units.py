"""Pure parts of grpo_hub.training.dynamic_sampling: group selection, rank slices, batch concatenation."""

import pytest
import torch

from grpo_hub.training.dynamic_sampling import (
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
