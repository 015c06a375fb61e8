"""Pure parts of grpo_hub.training.turns: turn ids, per-turn reward wrapper and matrix, MT-GRPO advantages."""

import asyncio
import math
import statistics

import pytest
import torch

from grpo_hub.training.turns import (
    mt_grpo_advantages,
    per_turn_reward,
    token_advantages,
    turn_ids_from_tool_mask,
    turn_reward_matrix,
)


def test_turn_ids_number_the_runs_of_model_tokens():
    tool_mask = torch.tensor([[1, 1, 0, 0, 1, 0, 1], [1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 1, 1, 1]])
    assert turn_ids_from_tool_mask(tool_mask).tolist() == [
        [1, 1, 1, 1, 2, 2, 3],
        [1, 1, 1, 1, 1, 1, 1],
        [0, 1, 1, 1, 2, 2, 2],
    ]


def test_per_turn_reward_hands_trl_the_sum_and_keeps_the_lists():
    @per_turn_reward
    def reward(prompts, completions, **kwargs):
        return [[1.0, 0.5], None, [None, 2.0], [None]]

    assert reward(prompts=[], completions=[]) == [1.5, None, 2.0, None]
    assert reward.turn_rewards == [[1.0, 0.5], None, [None, 2.0], [None]]
    assert reward.__name__ == "reward" and reward.is_per_turn_reward

    @per_turn_reward
    async def async_reward(prompts, completions, **kwargs):
        return [[1.0, 2.0]]

    assert asyncio.run(async_reward(prompts=[], completions=[])) == [3.0]
    assert async_reward.turn_rewards == [[1.0, 2.0]]


def test_turn_reward_matrix_pads_with_nan_and_checks_lengths():
    matrix = turn_reward_matrix([[1.0, None], [2.0], None, [9.0]], torch.tensor([2, 1, 1, 0]))
    expected = [[1.0, math.nan], [2.0, math.nan], [math.nan, math.nan], [math.nan, math.nan]]
    torch.testing.assert_close(matrix, torch.tensor(expected), equal_nan=True)
    with pytest.raises(ValueError, match="'mine' returned 1 rewards for completion 0, which has 2"):
        turn_reward_matrix([[1.0]], torch.tensor([2]), name="mine")


def naive_normalise(values: list[float | None]) -> list[float]:
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return [0.0] * len(values)
    mean, std = statistics.mean(present), statistics.stdev(present)
    return [0.0 if v is None else (v - mean) / (std + 1e-4) for v in values]


def test_mt_grpo_advantages_add_the_turn_and_outcome_advantages():
    turn_rewards = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, math.nan]])
    outcome = torch.tensor([1.0, 0.0, 0.0, 1.0])
    got = mt_grpo_advantages(turn_rewards, outcome, group_size=4, scope="turn")
    first = naive_normalise([1.0, 1.0, 0.0, 1.0])
    second = naive_normalise([1.0, 0.0, 0.0, None])
    out = naive_normalise([1.0, 0.0, 0.0, 1.0])
    expected = [[first[i] + out[i], second[i] + out[i]] for i in range(4)]
    expected[3][1] = out[3]  # no second turn: only the outcome part (unused by any token)
    torch.testing.assert_close(got, torch.tensor(expected), rtol=1e-5, atol=1e-5)
    assert got[1, 0] > out[1] > got[1, 1], (
        "right tool call, wrong answer: the call is blamed less than the answer"
    )


def test_token_advantages_spread_each_turns_value_over_its_tokens():
    turn_adv = torch.tensor([[0.5, -1.0], [2.0, 0.0]])
    ids = torch.tensor([[1, 1, 1, 2, 0], [1, 1, 0, 0, 0]])
    assert token_advantages(turn_adv, ids).tolist() == [[0.5, 0.5, 0.5, -1.0, 0.0], [2.0, 2.0, 0.0, 0.0, 0.0]]
