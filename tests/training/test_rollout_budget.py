"""rollout_budget="knapsack" (grpo_hub.training.rollout_budget): each prompt gets its own number of completions, the
batch keeps TRL's size on every rank, every group's advantages run over its own completions, and the prompts'
history survives a resume. Equal budgets give TRL's run bit for bit: tests/training/test_equivalence.py."""

from collections import defaultdict, deque

import pytest
import torch

from grpo_hub.algos.advantages import group_advantages, zero_signal_mask
from grpo_hub.training.rollout_budget import RolloutBudgets
from grpo_hub.training.selective_rollout import prompt_id
from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import half_signal_dataset, half_signal_reward, make_trainer, tiny_config


def budgets(rank: int, ranks_rows: list[list], **overrides) -> RolloutBudgets:
    """Budgets of `rank` whose gather returns every rank's rows (`ranks_rows`), groups of 4."""
    settings = {
        "objective": "knapsack",
        "low": 2,
        "high": None,
        "column": "level",
        "group_size": 4,
        "threshold": 1.0,
        **overrides,
    }
    return RolloutBudgets(
        gather_objects=lambda rows: [row for rank_rows in ranks_rows for row in rank_rows],
        rank=rank, metrics=defaultdict(list), **settings,
    )  # fmt: skip


def rows_of(prompts: list[str], group_size: int = 4) -> list[dict]:
    return [{"prompt": p, "level": int(p[-1])} for p in prompts for _ in range(group_size)]


def test_two_ranks_share_the_batch_out_by_the_prompts_history_and_keep_their_row_counts():
    """4 prompts on 2 ranks (8 rows each): a never-solved and an always-solved prompt give completions to the two
    prompts whose outcomes were mixed; each rank returns 8 rows, the two ranks' rows together are the budgets."""
    rows = rows_of(["hard 1", "easy 1", "mixed 2", "mixed 3"])
    ranks_rows = [rows[:8], rows[8:]]
    history = {"hard 1": [0.0, 16.0], "easy 1": [16.0, 16.0], "mixed 2": [8.0, 16.0], "mixed 3": [5.0, 16.0]}
    parts = []
    for rank in (0, 1):
        owner = budgets(rank, ranks_rows)
        owner.history = {prompt_id({"prompt": p}, None): list(h) for p, h in history.items()}
        parts.append(owner.assign(ranks_rows[rank]))
        assert len(parts[-1]) == 8
    assert sum(owner.sizes) == 16 and min(owner.sizes) >= 2 and len(set(owner.sizes)) > 1
    assert owner.sizes[0] == owner.sizes[1] == 2  # nothing to learn from either: the minimum
    expected = [row["prompt"] for size, group in zip(owner.sizes, ["hard 1", "easy 1", "mixed 2", "mixed 3"], strict=True)
                for row in [{"prompt": group}] * size]  # fmt: skip
    assert [row["prompt"] for row in parts[0] + parts[1]] == expected


def test_equal_estimates_give_every_prompt_num_generations():
    rows = rows_of(["a 1", "b 2", "c 3"])
    owner = budgets(0, [rows])
    assert [r["prompt"] for r in owner.assign(rows)] == [r["prompt"] for r in rows]
    assert owner.sizes == [4, 4, 4]


def test_a_prompt_never_seen_starts_from_its_columns_success_rate():
    """rollout_budget_column: a new level-4 prompt starts at level 4's rate (1 in 40, under a uniform prior: 2 in 42), a
    new level-1 prompt at level 1's (30 in 40: 31 in 42); without the column both start at the run's rate."""
    owner = budgets(0, [])
    owner.column_history = {4: [1.0, 40.0], 1: [30.0, 40.0]}
    owner.history = {7: [1.0, 40.0], 8: [30.0, 40.0]}  # the prompts seen so far
    assert owner.estimates([1, 2], [4, 1]) == [2 / 42, 31 / 42]
    assert owner.estimates([1, 2], [None, None]) == [32 / 82, 32 / 82]


def test_rows_that_are_not_groups_of_one_prompt_are_refused():
    rows = rows_of(["a 1", "b 2"])
    rows[1] = {"prompt": "other", "level": 1}
    with pytest.raises(ValueError, match="`rollout_budget`: .*num_generations rows of one prompt"):
        budgets(0, [rows]).assign(rows)


def test_record_counts_solved_completions_and_logs_each_groups_own_statistics():
    owner = budgets(0, [])
    owner.sizes, owner._ids, owner._labels = [2, 3, 3], [1, 2, 3], [1, 4, 4]
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, float("nan"), 0.0, 0.0, 0.0])
    owner.metrics["frac_reward_zero_std"].append(0.123)  # TRL's value, over groups of num_generations rows
    logged = deque([9.0] * 10)  # TRL's logged advantages: the last 8 are this batch's
    advantages = group_advantages(rewards, owner.sizes)
    owner.record(rewards, advantages, logged)
    assert owner.history == {1: [2.0, 2.0], 2: [1.0, 2.0], 3: [0.0, 3.0]}
    assert owner.column_history == {1: [2.0, 2.0], 4: [1.0, 5.0]}
    assert owner.metrics["frac_reward_zero_std"] == [
        float(zero_signal_mask(rewards, [2, 3, 3]).double().mean())
    ]
    assert list(logged) == [9.0, 9.0, *advantages.tolist()]
    metrics = owner.metrics
    assert (metrics["rollout_budget/min"], metrics["rollout_budget/max"]) == ([2.0], [3.0])
    assert metrics["rollout_budget/frac_groups_with_signal"] == [1 / 3]
    assert metrics["rollout_budget/frac_solved"] == [3 / 7]  # the NaN counts for nothing
    assert metrics["rollout_budget/completions/1"] == [2.0] and metrics["rollout_budget/completions/4"] == [
        3.0
    ]


def scored(owner: RolloutBudgets, prompts: list[str], rewards: list[float]) -> None:
    """`owner` assigns the batch of `prompts` (groups of 4: `owner` holds every budget at 4) and records `rewards`."""
    rows = rows_of(prompts)
    owner.assign(rows)
    assert owner.sizes == [4] * len(prompts)
    rewards = torch.tensor(rewards)
    owner.record(rewards, group_advantages(rewards, owner.sizes), deque())


def test_an_all_correct_first_batch_counts_every_completion_solved_and_no_estimate_reaches_1():
    """Every reward of the first batch 1.0 (all right): each completion is solved, and the estimates stay inside
    (0, 1): the prior is never exactly 0 or 1, so no prompt's value is identically zero."""
    owner = budgets(0, [rows_of(["a 1", "b 1"])], low=4, high=4)
    scored(owner, ["a 1", "b 1"], [1.0] * 8)
    ids = [prompt_id({"prompt": p}, None) for p in ("a 1", "b 1")]
    assert owner.history == {ids[0]: [4.0, 4.0], ids[1]: [4.0, 4.0]} and owner.column_history == {
        1: [8.0, 8.0]
    }
    seen_and_new = owner.estimates([*ids, 99], [1, 1, 2])
    assert all(0.5 < p < 1.0 for p in seen_and_new), seen_and_new


def test_an_all_wrong_first_batch_keeps_every_estimate_above_0():
    owner = budgets(0, [rows_of(["a 1", "b 1"])], low=4, high=4)
    scored(owner, ["a 1", "b 1"], [0.0] * 8)
    assert all(0.0 < p < 0.5 for p in owner.estimates([prompt_id({"prompt": "a 1"}, None), 99], [1, 2]))


def test_the_history_counts_solved_alike_however_the_reward_range_grows():
    """Correctness + 0.5 x step credit (chain-steps.yaml): a right answer scores 1.0-1.5, a wrong one 0-0.5. A first
    batch of wrong answers with partial credit solves nothing, and the history is the same in either batch order."""
    batches = [
        [0.0, 0.25, 0.5, 0.5, 0.0, 0.0, 0.25, 0.0],  # all wrong: the range so far is [0, 0.5]
        [1.5, 1.25, 0.5, 0.0, 1.0, 0.0, 0.25, 0.5],  # right answers arrive: [0, 1.5]
    ]
    histories = []
    for order in (batches, batches[::-1]):
        owner = budgets(0, [rows_of(["a 1", "b 1"])], low=4, high=4)
        for rewards in order:
            scored(owner, ["a 1", "b 1"], rewards)
        histories.append(owner.history)
    ids = [prompt_id({"prompt": p}, None) for p in ("a 1", "b 1")]
    assert histories[0] == histories[1] == {ids[0]: [2.0, 8.0], ids[1]: [1.0, 8.0]}


def test_the_history_round_trips_through_its_state_and_a_state_of_another_threshold_is_refused():
    owner = budgets(0, [rows_of(["a 1", "b 2"])], low=4, high=4)
    scored(owner, ["a 1", "b 2"], [1.0, 0.0, 1.5, 0.5, 0.0, 0.0, 1.0, float("nan")])
    state = owner.state_dict()
    restored = budgets(0, [])
    restored.load_state_dict(state)
    assert (restored.history, restored.column_history) == (owner.history, owner.column_history)
    assert restored.estimates(owner._ids, owner._labels) == owner.estimates(owner._ids, owner._labels)
    with pytest.raises(ValueError, match=r"`rollout_budget_success_threshold`: is 0.5, .* solved at 1.0\. Fix: resume "
                       r"with rollout_budget_success_threshold=1.0"):  # fmt: skip
        budgets(0, [], threshold=0.5).load_state_dict(state)


def test_a_history_saved_before_the_threshold_loads_its_counts():
    """rollout_budget.pt as saved when solved meant the upper half of the rewards seen (with `reward_range`)."""
    owner = budgets(0, [])
    owner.load_state_dict(
        {"history": {5: [1.0, 4.0]}, "column_history": {1: [1.0, 4.0]}, "reward_range": [0.0, 1.0]}
    )
    assert (owner.history, owner.column_history) == ({5: [1.0, 4.0]}, {1: [1.0, 4.0]})
    assert owner.estimates([5], [1]) == [(1.0 + 2 * (2 / 6)) / (4 + 2)]


def graded_trainer(tmp_path, model_dir, **overrides):
    """half_signal_reward: 0 on "Stay quiet", (k mod 7) / 7 on the digit prompts, of which 4/7 and up count solved."""
    settings = {
        "rollout_budget": "knapsack",
        "max_steps": 6,
        "rollout_budget_success_threshold": 0.5,
        **overrides,
    }
    args = tiny_config(tmp_path, **settings)
    return make_trainer(
        GRPOHubTrainer, model_dir, args, reward_funcs=[half_signal_reward], dataset=half_signal_dataset(16)
    )


def test_a_ragged_batch_trains_each_groups_own_advantages(tmp_path, tiny_model_dir):
    """After a few steps the budgets differ; the last batch's advantages (TRL's completions log) are each group's own,
    over all ranks' rows, and so is every scored row's zero-signal flag that filtering reads."""
    trainer = graded_trainer(tmp_path, tiny_model_dir, filter_zero_signal=True, padding_free=True)
    trainer.train()
    sizes = trainer._budgets.sizes
    assert len(set(sizes)) > 1, "the budgets never differed: the test checks nothing"
    rewards = torch.tensor(list(trainer._logs["rewards"]["half_signal_reward"])[-sum(sizes) :])
    logged = torch.tensor(list(trainer._logs["advantages"])[-sum(sizes) :])
    torch.testing.assert_close(logged, group_advantages(rewards, sizes))
    spreads = [h["rollout_budget/std"] for h in trainer.state.log_history if "rollout_budget/std" in h]
    assert spreads[0] == 0.0 and max(spreads) > 0  # the first step knows nothing: TRL's budgets


def test_a_resumed_run_continues_the_prompts_history(tmp_path, tiny_model_dir):
    full = graded_trainer(tmp_path / "full", tiny_model_dir)
    full.train()
    cut = graded_trainer(tmp_path / "cut", tiny_model_dir, save_strategy="steps", save_steps=3)
    cut.train()
    resumed = graded_trainer(tmp_path / "cut", tiny_model_dir)
    resumed.train(resume_from_checkpoint=str(tmp_path / "cut" / "checkpoint-3"))
    assert len(set(full._budgets.sizes)) > 1 or any(
        h.get("rollout_budget/std", 0) > 0 for h in full.state.log_history
    ), "the budgets never differed: the test checks nothing"
    assert resumed._budgets.history == full._budgets.history
    assert resumed._budgets.sizes == full._budgets.sizes


def test_a_resume_without_the_history_is_refused(tmp_path, tiny_model_dir):
    cut = graded_trainer(tmp_path, tiny_model_dir, save_strategy="steps", save_steps=3)
    cut.train()
    (tmp_path / "checkpoint-3" / "rollout_budget.pt").unlink()
    with pytest.raises(ValueError, match="rollout_budget='knapsack', but no rollout_budget.pt"):
        graded_trainer(tmp_path, tiny_model_dir).train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))


@pytest.mark.distributed
@pytest.mark.slow
def test_two_ranks_share_the_same_budgets_and_train_the_same_weights():
    """2 gloo ranks, 3 groups of 4 per generation batch (6 rows a rank): both ranks allocate the same budgets, each
    scores 6 rows, together the prompts repeated by their budgets, and the weights stay equal."""
    from pathlib import Path

    from tests.training.distributed.checks import assert_two_rank_world
    from tests.training.distributed.launch import run_accelerate

    worker = str(Path(__file__).parent / "distributed" / "budget_worker.py")
    result = run_accelerate("cpu-ddp.yaml", worker, ["--max-steps", "8"])
    assert_two_rank_world(result, "MULTI_CPU")
    first, second = result["ranks"]
    assert first["sizes"] == second["sizes"] and len(first["sizes"]) == 8
    assert any(len(set(sizes)) > 1 for sizes in first["sizes"]), "the budgets never differed: nothing checked"
    for sizes, rows0, rows1 in zip(first["sizes"], first["scored_rows"], second["scored_rows"], strict=True):
        together = rows0 + rows1
        assert len(rows0) == len(rows1) == 6 and sum(sizes) == 12
        groups, start = [], 0
        for size in sizes:
            groups.append(together[start : start + size])
            start += size
        assert all(len(set(group)) == 1 for group in groups)  # each group one prompt, its budget's rows
    assert first["param_fingerprint"] == second["param_fingerprint"], "the ranks' weights diverged"
