"""The chain task: problems and their worked solutions, splits, reward, evaluation."""

import random
import re

import pytest

from grpo_hub.tasks import chain, get_reward_funcs, load_task_dataset


def parse_line(line: str) -> tuple[int, list[str]]:
    """("67*3-3") -> (67, ["*3", "-3"]): the leading integer and the one-digit steps after it."""
    head = re.match(r"\d+", line).group()
    rest = line[len(head) :]
    return int(head), [rest[i : i + 2] for i in range(0, len(rest), 2)]


def naive_value(line: str) -> int:
    """Left-to-right value of "37+5*3-4" (no precedence)."""
    value, steps = parse_line(line)
    for step in steps:
        value = eval(f"{value}{step}")  # one binary op on two integers
    return value


@pytest.mark.parametrize("level", chain.LEVELS)
def test_each_clause_copies_one_step_and_its_result_feeds_the_next(level):
    rng = random.Random(level)
    for _ in range(300):
        problem = chain.make_problem(rng, level)
        start, steps = parse_line(problem.question.removesuffix("="))
        clauses = problem.solution.split(",")
        assert len(clauses) == len(steps) == level == problem.level and 10 <= start <= 99
        value = start
        for clause, step in zip(clauses, steps, strict=True):
            result = naive_value(f"{value}{step}")
            assert clause == f"{value}{step}={result}" and 0 <= result <= chain.MAX_VALUE
            value = result
        assert problem.answer == str(value) == str(naive_value(problem.question.removesuffix("=")))


def test_bad_level_is_refused():
    with pytest.raises(ValueError, match="level"):
        chain.make_problem(random.Random(0), 5)


def test_heldout_has_2000_distinct_problems_and_train_never_overlaps_it():
    heldout = chain.heldout_problems()
    assert len(heldout) == 2000 == len({p.question for p in heldout})
    assert [sum(p.level == level for p in heldout) for level in chain.LEVELS] == [500] * 4
    train = chain.train_problems(4000)
    assert not {p.question for p in train} & {p.question for p in heldout}
    assert chain.train_problems(50) == chain.train_problems(50)
    assert chain.train_problems(50, seed=1) != chain.train_problems(50)
    assert chain.split_problems("heldout", 3) == [p for i, p in enumerate(heldout) if i % 500 < 3]
    with pytest.raises(ValueError, match="held-out split"):
        chain.split_problems("heldout", 501)
    with pytest.raises(ValueError, match="split"):
        chain.split_problems("test", 3)


def test_reward_reads_the_last_integer_of_the_scratchpad():
    completions = [
        [{"role": "assistant", "content": "37+5=42,42*3=126"}],
        [{"role": "assistant", "content": "37+5=42,42*3=125"}],
        [{"role": "assistant", "content": "126"}],
        [{"role": "assistant", "content": "no idea"}],
    ]
    assert chain.chain_correctness_reward(None, completions, answer=["126"] * 4) == [1.0, 0.0, 1.0, 0.0]


def test_builtin_task_rows_and_reward():
    dataset = load_task_dataset("chain", n=8, seed=0)
    assert dataset.column_names == ["prompt", "answer", "level"] and len(dataset) == 8
    assert get_reward_funcs("chain") == [chain.chain_correctness_reward]
