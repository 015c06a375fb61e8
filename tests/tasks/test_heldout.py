"""Held-out problems never reach training, whatever the seeds (every scored task, through the recipe's loader)."""

import pytest

from grpo_hub.tasks import SCORED_TASKS, load_task_dataset

SEEDS = (0, 1, 2, 7, 123)


def _evaluated(task) -> set[str]:
    """The questions `evaluate` scores by default, whatever seed it is given."""
    module = SCORED_TASKS[task]
    questions = {
        p.question for seed in SEEDS for p in module.split_problems("heldout", module.HELDOUT_PER_LEVEL, seed)
    }
    assert questions == {p.question for p in module.heldout_problems()}  # one fixed set
    return questions


@pytest.mark.parametrize("task", sorted(SCORED_TASKS))
def test_no_training_seed_draws_a_heldout_problem(task):
    heldout = _evaluated(task)
    for seed in SEEDS:
        rows = load_task_dataset(task, n=4096, seed=seed)  # what recipes/grpo.py --dataset_seed trains on
        trained = {row["prompt"][-1]["content"] for row in rows}
        assert len(trained) > 1000 and not trained & heldout, (task, seed)
    assert load_task_dataset(task, n=64, seed=1)["prompt"] != load_task_dataset(task, n=64, seed=0)["prompt"]
