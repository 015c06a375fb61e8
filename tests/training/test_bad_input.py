"""Bad data and bad rewards fail at once with the dataset row or the reward function named, weights untouched."""

import math

import pytest
import torch
from datasets import Dataset, IterableDataset

from grpo_hub.training.input_checks import empty_prompt_rows
from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import make_trainer, tiny_config

PROMPTS = [f"Write only digits: {i}" for i in range(8)]


def _snapshot(trainer) -> dict:
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters()}


def _reward_with(value, row: int):
    def odd_reward(completions, **kwargs):
        return [value if i == row else float(len(c) % 3) for i, c in enumerate(completions)]

    return odd_reward


@pytest.mark.parametrize("value", [math.inf, -math.inf, 1e300])  # 1e300 is inf in float32
def test_infinite_reward_names_the_function_and_rows_and_leaves_weights(tmp_path, tiny_model_dir, value):
    args = tiny_config(tmp_path, adv_norm="no_baseline")
    trainer = make_trainer(
        GRPOHubTrainer,
        tiny_model_dir,
        args,
        reward_funcs=[_reward_with(value, 3)],
        dataset=Dataset.from_dict({"prompt": PROMPTS}),
    )
    before = _snapshot(trainer)
    with pytest.raises(
        ValueError, match=r"^`reward_funcs`: infinite reward from 'odd_reward' at row\(s\) 3 "
    ):
        trainer.train()
    after = _snapshot(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("adv_norm", ["no_baseline", "mean_only"])
def test_finite_rewards_that_overflow_the_gradient_leave_the_weights(tmp_path, tiny_model_dir, adv_norm):
    """Rewards near float32's max pass the reward check, but their gradients overflow: the step is refused."""

    def huge_reward(completions, **kwargs):
        return [3e38 * (i % 2) for i in range(len(completions))]

    trainer = make_trainer(
        GRPOHubTrainer,
        tiny_model_dir,
        tiny_config(tmp_path, adv_norm=adv_norm),
        reward_funcs=[huge_reward],
        dataset=Dataset.from_dict({"prompt": PROMPTS}),
    )
    before = _snapshot(trainer)
    with pytest.raises(
        FloatingPointError, match=r"optimizer step 1: non-finite gradients in .*weights are unchanged"
    ):
        trainer.train()
    after = _snapshot(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_gradient_guard_names_the_parameters_and_stays_off_under_fp16():
    from types import SimpleNamespace

    from grpo_hub.training.finite_guard import FiniteGradientsCallback, nonfinite_gradients

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    assert nonfinite_gradients(model) == []  # no gradients yet
    model(torch.ones(1, 2)).sum().backward()
    assert nonfinite_gradients(model) == []
    model[1].weight.grad[0, 0] = math.nan
    assert nonfinite_gradients(model) == ["1.weight"]
    state = SimpleNamespace(global_step=4)
    with pytest.raises(FloatingPointError, match=r"optimizer step 5: non-finite gradients in 1.weight"):
        FiniteGradientsCallback().on_pre_optimizer_step(SimpleNamespace(fp16=False), state, None, model=model)
    FiniteGradientsCallback().on_pre_optimizer_step(SimpleNamespace(fp16=True), state, None, model=model)


def test_unscored_rewards_still_train_with_finite_weights(tmp_path, tiny_model_dir):
    """None and NaN mean "not scored" in TRL: they must keep training (advantage 0), not trip the checks."""

    def partial_reward(completions, **kwargs):
        return [
            None if i % 4 == 0 else (math.nan if i % 4 == 1 else float(len(c) % 5))
            for i, c in enumerate(completions)
        ]

    args = tiny_config(tmp_path, adv_norm="no_baseline", max_steps=2)
    trainer = make_trainer(
        GRPOHubTrainer,
        tiny_model_dir,
        args,
        reward_funcs=[partial_reward],
        dataset=Dataset.from_dict({"prompt": PROMPTS}),
    )
    before = _snapshot(trainer)
    trainer.train()
    after = _snapshot(trainer)
    assert all(torch.isfinite(p).all() for p in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before), "nothing was trained"


def test_empty_prompt_rows_of_string_and_conversational_datasets():
    assert empty_prompt_rows(Dataset.from_dict({"prompt": ["a", "", "b", ""]})) == [1, 3]
    messages = [[{"role": "user", "content": "hi"}], []]
    assert empty_prompt_rows(Dataset.from_dict({"prompt": messages})) == [1]
    assert empty_prompt_rows(Dataset.from_dict({"prompt": ["a", "", "b"]}).select([2, 1])) == [1]
    assert empty_prompt_rows(Dataset.from_dict({"prompt": ["a", None]})) == [1]
    assert empty_prompt_rows(Dataset.from_dict({"prompt": ["a", " "]})) == []


def test_empty_prompt_is_rejected_at_start_with_its_row(tmp_path, tiny_model_dir):
    data = Dataset.from_dict({"prompt": [*PROMPTS[:5], "", *PROMPTS[5:]]})
    with pytest.raises(ValueError, match=r"^`train_dataset`: empty prompt at row\(s\) 5;"):
        make_trainer(GRPOHubTrainer, tiny_model_dir, tiny_config(tmp_path), dataset=data)
    good = Dataset.from_dict({"prompt": PROMPTS})
    with pytest.raises(ValueError, match=r"^`eval_dataset\['held'\]`: empty prompt at row\(s\) 0;"):
        make_trainer(
            GRPOHubTrainer,
            tiny_model_dir,
            tiny_config(tmp_path, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8),
            dataset=good,
            eval_dataset={"held": Dataset.from_dict({"prompt": ["", "x"]})},
        )


def test_empty_prompt_of_an_iterable_dataset_fails_before_generation(tmp_path, tiny_model_dir):
    def rows():
        for i, prompt in enumerate(PROMPTS):
            yield {"prompt": "" if i == 2 else prompt}

    trainer = make_trainer(
        GRPOHubTrainer, tiny_model_dir, tiny_config(tmp_path), dataset=IterableDataset.from_generator(rows)
    )
    with pytest.raises(ValueError, match=r"^`train_dataset`: empty prompt at position\(s\) \d"):
        trainer.train()
