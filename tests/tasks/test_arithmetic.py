"""The arithmetic task: problems, splits, answer parsing and rewards (no model needed)."""

import random

import pytest

from grpo_hub.tasks import get_reward_funcs, load_task_dataset
from grpo_hub.tasks.arithmetic import (
    FORMAT_REWARD,
    HELDOUT_PER_LEVEL,
    LEVELS,
    arithmetic_correctness_reward,
    arithmetic_format_reward,
    heldout_problems,
    load_arithmetic,
    make_problem,
    parse_answer,
    split_problems,
    train_problems,
)


def evaluate_left_to_right(question: str) -> int:
    """Reference evaluator: integers and + - * applied left to right."""
    tokens = question.rstrip("=").replace("+", " + ").replace("-", " - ").replace("*", " * ").split()
    value = int(tokens[0])
    for op, operand in zip(tokens[1::2], tokens[2::2], strict=True):
        value = {"+": value + int(operand), "-": value - int(operand), "*": value * int(operand)}[op]
    return value


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n_ops", [1, 2])
def test_problems_have_a_level_digit_number_one_digit_operands_and_the_right_answer(level, n_ops):
    rng = random.Random(level * 10 + n_ops)
    for _ in range(50):
        problem = make_problem(rng, level, n_ops)
        operands = problem.question.rstrip("=").replace("+", " ").replace("-", " ").replace("*", " ").split()
        assert len(operands) == n_ops + 1 and len(operands[0]) == level
        assert all(len(x) == 1 for x in operands[1:])
        assert int(problem.answer) == evaluate_left_to_right(problem.question)


def test_bad_level_or_op_count_is_refused():
    with pytest.raises(ValueError, match="level"):
        make_problem(random.Random(0), 5)
    with pytest.raises(ValueError, match="n_ops"):
        make_problem(random.Random(0), 1, n_ops=0)


def test_splits_are_fixed_by_seed_and_disjoint():
    heldout = heldout_problems()
    assert heldout == heldout_problems() and heldout != heldout_problems(n_ops=2)
    assert len(heldout) == len(LEVELS) * HELDOUT_PER_LEVEL
    assert len({p.question for p in heldout}) == len(heldout)
    train = train_problems(2000, seed=0)
    assert train == train_problems(2000, seed=0)
    assert not {p.question for p in train} & {p.question for p in heldout}
    assert {p.level for p in train} == set(LEVELS)


def test_heldout_split_takes_the_first_n_of_each_level():
    small = split_problems("heldout", 3)
    assert [p.level for p in small] == [level for level in LEVELS for _ in range(3)]
    assert set(small) <= set(heldout_problems())
    with pytest.raises(ValueError, match="per level"):
        split_problems("heldout", HELDOUT_PER_LEVEL + 1)
    with pytest.raises(ValueError, match="split"):
        split_problems("test", 3)


def test_dataset_rows_are_chat_prompts_with_answer_and_level():
    ds = load_task_dataset("arithmetic", n=8, seed=0)
    assert len(ds) == 8 and set(ds.column_names) == {"prompt", "answer", "level"}
    row = ds[0]
    assert row["prompt"] == [{"role": "user", "content": row["prompt"][0]["content"]}]
    assert row["prompt"][0]["content"].endswith("=")
    assert len(load_arithmetic("heldout", n=2)) == 2 * len(LEVELS)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", "42"),
        ("-17", "-17"),
        (" -0 ", "0"),
        ("007", "7"),
        ("-007", "-7"),
        ("The answer is 12.", "12"),
        ("12-3=9, so 9", "9"),
        ("5-3", "3"),  # a minus after a digit is the operator, not a sign
        ("= -3", "-3"),
        ("x-5", "5"),
        ("", None),
        ("no answer", None),
        ("-", None),
        ("9" * 5000, "9" * 5000),  # beyond int()'s 4300-digit limit
    ],
)
def test_parse_answer_edge_cases(text, expected):
    assert parse_answer(text) == expected


def test_correctness_reward_on_edge_cases():
    completions = ["-12", "answer: -12", "12", "", "-12 or 13", "-0012", "9" * 5000]
    rewards = arithmetic_correctness_reward(None, completions, answer=["-12"] * 6 + ["9" * 5000])
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    conversational = [[{"role": "assistant", "content": "-12"}]]
    assert arithmetic_correctness_reward(None, conversational, answer=["-12"]) == [1.0]


def test_format_reward_is_light_and_wants_one_bare_integer():
    rewards = arithmetic_format_reward(None, ["-12", " 7\n", "7 8", "x7", "", "=7"])
    assert rewards == [FORMAT_REWARD, FORMAT_REWARD, 0.0, 0.0, 0.0, 0.0]
    assert 0 < FORMAT_REWARD < 0.5


def test_reward_funcs_of_the_task():
    assert get_reward_funcs("arithmetic") == [arithmetic_correctness_reward, arithmetic_format_reward]
