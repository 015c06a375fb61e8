"""grpo_hub.config.recipe_parser: the recipe's own arguments' checks, the held-out evaluation's two beside each other
(through the recipe's command line: tests/recipes/test_recipe.py)."""

from types import SimpleNamespace

import pytest

from grpo_hub.config.recipe_parser import check_recipe_arguments

HELDOUT = {"chain": 500, "arithmetic": 50}  # held-out problems per level of the scored tasks


def recipe_arguments(**changes) -> SimpleNamespace:
    """The recipe's arguments at their defaults (`RecipeArguments`), with `changes`."""
    defaults = {"task": "chain", "num_prompts": 512, "dataset_seed": 0, "eval_pass_k": 0, "eval_per_level": None,
                "vllm_server_start": False, "vllm_server_cores": None, "vllm_server_gpus": None}  # fmt: skip
    return SimpleNamespace(**{**defaults, **changes})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"eval_pass_k": 8}, r"`eval_pass_k`: is reported for --task arithmetic only"),
        (
            {"task": "digits", "eval_per_level": 5},
            r"`eval_per_level`: sizes the held-out evaluation of tasks",
        ),
        (
            {"eval_per_level": 501},
            r"`eval_per_level`: 501 problems per level, but task 'chain' holds out 500",
        ),
        ({"task": "arithmetic", "eval_per_level": 51}, r"task 'arithmetic' holds out 50 per level"),
    ],
)
def test_the_held_out_evaluation_flags_are_checked_together(changes, message):
    with pytest.raises(ValueError, match=message):
        check_recipe_arguments(recipe_arguments(**changes), HELDOUT)


def test_every_task_may_size_its_held_out_evaluation_up_to_what_it_holds_out():
    for task, available in HELDOUT.items():
        check_recipe_arguments(recipe_arguments(task=task, eval_per_level=available), HELDOUT)
    check_recipe_arguments(recipe_arguments(task="arithmetic", eval_pass_k=8), HELDOUT)
