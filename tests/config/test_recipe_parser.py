"""grpo_hub.config.recipe_parser: the recipe's own arguments' checks, the held-out evaluation's two beside each other,
and the choice of reward functions with their weights (through the recipe's command line:
tests/recipes/test_recipe.py)."""

from types import SimpleNamespace

import pytest

from grpo_hub.config.recipe_parser import check_recipe_arguments, check_reward_choice
from grpo_hub.tasks import get_reward_funcs

HELDOUT = {"chain": 500, "arithmetic": 50}  # held-out problems per level of the scored tasks


def recipe_arguments(**changes) -> SimpleNamespace:
    """The recipe's arguments at their defaults (`RecipeArguments`), with `changes`."""
    defaults = {"task": "chain", "num_prompts": 512, "dataset_seed": 0, "eval_pass_k": 0, "eval_per_level": None,
                "vllm_server_start": False, "vllm_server_cores": None, "vllm_server_gpus": None,
                "reward_funcs": None}  # fmt: skip
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


def test_reward_funcs_are_the_tasks_and_reward_weights_weigh_each_once():
    steps = ["chain_correctness_reward", "chain_step_reward"]
    for names, weights in [(None, None), (None, [1.0]), (steps, [1.0, 0.5]), (steps[1:], None)]:
        check_reward_choice(recipe_arguments(reward_funcs=names), weights, get_reward_funcs)
    with pytest.raises(ValueError) as refused:
        check_reward_choice(recipe_arguments(task="digits", reward_funcs=steps[1:]), None, get_reward_funcs)
    assert str(refused.value) == (
        "`reward_funcs`: reward functions for task 'digits': unknown ['chain_step_reward']; choose from "
        "digit_fraction_reward. Fix: name only those, each once, or drop --reward_funcs."
    )
    with pytest.raises(ValueError) as refused:
        check_reward_choice(recipe_arguments(reward_funcs=steps), [1.0], get_reward_funcs)
    assert str(refused.value) == (
        "`reward_weights`: 1 weights for the 2 reward function(s) of this run (task 'chain', reward_funcs "
        f"{steps}). Fix: give 2 weight(s), or drop --reward_weights."
    )
    with pytest.raises(ValueError, match=r"^`reward_weights`: 2 weights for the 1 reward function\(s\)"):
        check_reward_choice(recipe_arguments(), [1.0, 0.5], get_reward_funcs)
