"""The chain task: problems and their worked solutions, splits, reward, evaluation."""

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
    assert dataset.column_names == ["prompt", "answer", "level", "solution"] and len(dataset) == 8
    problems = chain.train_problems(8, seed=0)
    assert dataset["solution"] == [p.solution for p in problems] and dataset["answer"] == [
        p.answer for p in problems
    ]
    assert get_reward_funcs("chain") == [chain.chain_correctness_reward]
    assert get_reward_funcs("chain", ["chain_step_reward", "chain_correctness_reward"]) == [
        chain.chain_step_reward,
        chain.chain_correctness_reward,
    ]


def naive_leading_steps(scratchpad: str, solution: str) -> int:
    """The largest k such that the scratchpad's first k clauses (spaces dropped) are the solution's first k."""
    written = [clause.strip() for clause in scratchpad.split(",")]
    worked = solution.split(",")
    return max(k for k in range(len(worked) + 1) if written[:k] == worked[:k])


CLAUSE_EDITS = st.sampled_from(["keep", "wrong", "spaces", "drop"])


@given(
    seed=st.integers(0, 10**6),
    level=st.sampled_from(chain.LEVELS),
    edits=st.lists(CLAUSE_EDITS, min_size=4, max_size=4),
    tail=st.sampled_from(["", ",", ",1+1=2", "\n"]),
)
def test_leading_steps_matches_a_naive_count(seed, level, edits, tail):
    problem = chain.make_problem(random.Random(seed), level)
    clauses = []
    for clause, edit in zip(problem.solution.split(","), edits, strict=False):
        if edit == "drop":
            break
        clauses.append({"keep": clause, "wrong": clause + "1", "spaces": f" {clause} "}[edit])
    scratchpad = ",".join(clauses) + tail
    assert chain.leading_steps(scratchpad, problem.solution) == naive_leading_steps(
        scratchpad, problem.solution
    )


def test_step_reward_is_the_share_of_the_worked_solution_right_from_the_first_clause():
    solution = "37+5=42,42*3=126,126-4=122"
    completions = [
        "37+5=42,42*3=126,126-4=122",  # all three
        "37+5=42,42*3=125,125-4=121",  # the second step wrong: only the first counts
        "37+5=43,43*3=129,126-4=122",  # the first wrong: a right later clause does not count
        "",  # nothing written
        " 37+5=42 , 42*3=126",  # spaces around clauses are ignored
        [{"role": "assistant", "content": "37+5=42,42*3=126,126-4=122,122"}],  # a conversational completion
    ]
    rewards = chain.chain_step_reward(None, completions, solution=[solution] * 6)
    assert rewards == pytest.approx([1.0, 1 / 3, 0.0, 0.0, 2 / 3, 1.0])
    right = chain.chain_correctness_reward(None, completions[1:4], answer=["122"] * 3)
    assert right == [0.0, 1.0, 0.0] and rewards[1] > rewards[3]  # step credit ranks what correctness ties
