"""Bad data and bad rewards fail at once with the dataset row or the reward function named, weights untouched."""

import asyncio
import math

import numpy as np
import pytest
import torch
from datasets import Dataset, IterableDataset

from grpo_hub.training.input_checks import (
    check_batch_prompts,
    check_reward_output,
    checked_reward_funcs,
    empty_prompt_rows,
)
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


def test_rows_without_a_prompt_pass_when_an_environment_supplies_it():
    """With `environment_factory`, TRL lets a row omit "prompt": the environment's reset() supplies it."""
    rows = [{"environment": "counter"}, {"level": 3}]
    check_batch_prompts(rows, environment_prompts=True)
    with pytest.raises(ValueError, match=r"^`train_dataset`: empty prompt at position\(s\) 0, 1 of a batch"):
        check_batch_prompts(rows, environment_prompts=False)
    for empty in ("", [], None):  # these crash plain TRL with an environment too
        with pytest.raises(ValueError, match=r"position\(s\) 1 of a batch"):
            check_batch_prompts([{"prompt": "hi"}, {"prompt": empty}], environment_prompts=True)


def test_environment_owned_prompts_train(tmp_path, tiny_model_dir):
    """A dataset with no "prompt" column, each prompt coming from the environment's reset() (TRL's environment-owned
    data): the empty-prompt checks must let it train, as plain TRL does."""
    from grpo_hub.tasks.tool_task import tool_tokenizer
    from tests.helpers import load_model

    resets = []

    class CounterEnvironment:
        def reset(self, **kwargs):
            resets.append(kwargs)
            return f"Count to {kwargs['level']}."

        def increment(self, step: int) -> int:
            """
            Increment the counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            return step

    def length_reward(completions, **kwargs):
        return [float(len(str(c)) % 3) for c in completions]

    model, _ = load_model(tiny_model_dir)
    trainer = GRPOHubTrainer(
        model=model,
        reward_funcs=[length_reward],
        args=tiny_config(tmp_path),
        train_dataset=Dataset.from_dict({"level": list(range(8))}),
        processing_class=tool_tokenizer(tiny_model_dir),
        environment_factory=CounterEnvironment,
    )
    trainer.train()
    assert resets and all("level" in kwargs and "prompt" not in kwargs for kwargs in resets)


def test_empty_prompt_of_an_iterable_dataset_fails_before_generation(tmp_path, tiny_model_dir):
    def rows():
        for i, prompt in enumerate(PROMPTS):
            yield {"prompt": "" if i == 2 else prompt}

    trainer = make_trainer(
        GRPOHubTrainer, tiny_model_dir, tiny_config(tmp_path), dataset=IterableDataset.from_generator(rows)
    )
    with pytest.raises(ValueError, match=r"^`train_dataset`: empty prompt at position\(s\) \d"):
        trainer.train()


# --- reward functions whose output TRL cannot read: named before TRL converts it ---

MALFORMED = {  # output for n completions -> what the message must say about it
    "float": (lambda n: 0.5, r"returned float 0\.5"),
    "strings": (lambda n: ["1.0"] * n, r"returned list of 8 values \(str"),
    "string": (lambda n: "1.0", r"returned str '1\.0'"),
    "column_array": (lambda n: np.ones((n, 1)), r"returned ndarray of shape \(8, 1\)"),
    "nested_list": (lambda n: [[1.0]] * n, r"returned list of 8 values \(list"),
    "wrong_length": (lambda n: [1.0] * (n - 1), r"returned list of 7 values \(float"),
    "none": (lambda n: None, r"returned NoneType None"),
    "scalar_tensor": (lambda n: torch.tensor(0.5), r"returned Tensor of shape \(\)"),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_reward_output_is_named(kind):
    make, said = MALFORMED[kind]
    with pytest.raises(
        ValueError, match=rf"^`reward_funcs`: reward function 'my_reward' {said}.* for 8 completions"
    ):
        check_reward_output(make(8), "my_reward", 8)
    with pytest.raises(ValueError, match=r"Fix: return one float, or None, per completion"):
        check_reward_output(make(8), "my_reward", 8)


VALID = {  # outputs plain TRL reads, and the rewards it reads from them
    "floats": ([1.0, 2.5, 0.0], [1.0, 2.5, 0.0]),
    "ints_and_bools": ([1, True, 0], [1.0, 1.0, 0.0]),
    "none_and_nan": ([None, math.nan, 1.0], [math.nan, math.nan, 1.0]),
    "numpy": (np.array([1.0, 2.0, 3.0]), [1.0, 2.0, 3.0]),
    "numpy_ints": (np.array([1, 2, 3]), [1.0, 2.0, 3.0]),
    "tensor": (torch.tensor([1.0, 2.0, 3.0]), [1.0, 2.0, 3.0]),
    "numpy_scalars": ([np.float32(1.0), np.int64(2), np.float64(3.0)], [1.0, 2.0, 3.0]),
    "scalar_tensors": ([torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)], [1.0, 2.0, 3.0]),
    "tuple": ((1.0, 2.0, 3.0), [1.0, 2.0, 3.0]),
    "generator": ((x for x in (1.0, 2.0, 3.0)), [1.0, 2.0, 3.0]),
}


@pytest.mark.parametrize("kind", list(VALID))
def test_valid_reward_output_reads_as_in_trl(kind):
    output, expected = VALID[kind]
    values = check_reward_output(output, "my_reward", 3)
    read = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float32)  # TRL's reading
    assert torch.equal(read.isnan(), torch.tensor([math.isnan(x) for x in expected]))
    assert torch.equal(read.nan_to_num(-7.0), torch.tensor(expected).nan_to_num(-7.0))


def test_checked_reward_funcs_keep_models_names_and_async():
    model = torch.nn.Linear(1, 1)

    def sync_reward(prompts, completions, **kwargs):
        return [1.0] * len(prompts)

    async def async_reward(prompts, completions, **kwargs):
        return 0.5

    wrapped_model, wrapped_sync, wrapped_async = checked_reward_funcs(
        [model, sync_reward, async_reward], ["model", "sync_reward", "async_reward"]
    )
    assert wrapped_model is model
    assert wrapped_sync(prompts=["a", "b"], completions=["x", "y"]) == [1.0, 1.0]
    assert wrapped_sync.__name__ == "sync_reward"
    from trl.trainer.utils import is_async_callable

    assert is_async_callable(wrapped_async) and not is_async_callable(wrapped_sync)
    with pytest.raises(
        ValueError, match=r"^`reward_funcs`: reward function 'async_reward' returned float 0\.5"
    ):
        asyncio.run(wrapped_async(prompts=["a", "b"], completions=["x", "y"]))


@pytest.mark.parametrize("kind", ["float", "strings", "column_array", "nested_list", "wrong_length"])
def test_malformed_reward_output_fails_naming_the_function(tmp_path, tiny_model_dir, kind):
    make, said = MALFORMED[kind]

    def shaped_reward(completions, **kwargs):
        return make(len(completions))

    trainer = make_trainer(
        GRPOHubTrainer,
        tiny_model_dir,
        tiny_config(tmp_path),
        reward_funcs=[shaped_reward],
        dataset=Dataset.from_dict({"prompt": PROMPTS}),
    )
    before = _snapshot(trainer)
    with pytest.raises(ValueError, match=rf"^`reward_funcs`: reward function 'shaped_reward' {said}"):
        trainer.train()
    after = _snapshot(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert trainer.reward_funcs == [shaped_reward]  # the user's functions, not the checking wrappers


def test_vllm_without_vllm_installed_is_one_line_naming_the_install(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    args = tiny_config(tmp_path, use_vllm=True, vllm_mode="server")
    with pytest.raises(
        ValueError, match=r"^`use_vllm`: training with vLLM needs vLLM.*Fix: pip install 'grpo-hub\[vllm\]'"
    ):
        GRPOHubTrainer("unused: refused before the model loads", reward_funcs=[len], args=args)
