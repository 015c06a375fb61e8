"""GRPOHubTrainer with dynamic sampling on the tiny model: full informative batches, data accounting, the cap."""

import math

import pytest
import torch

from grpo_hub.config.hub_config import GRPOHubConfig
from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import make_trainer, step_logs, tiny_config

from .degenerate import degenerate_dataset, mostly_flat_digit_reward, mostly_flat_reward

# 16 rows per generation batch = 4 groups of 4; with one graded prompt in 4, one group in 4 is informative.
BATCH = {"per_device_train_batch_size": 16, "shuffle_dataset": False}


def degenerate_trainer(tmp_path, model_dir, n_prompts=400, reward=mostly_flat_reward, **overrides):
    args = tiny_config(tmp_path, **{**BATCH, **overrides})
    dataset = degenerate_dataset(n_prompts)
    seen: list[str] = []

    def recording_reward(prompts, completions, **kwargs):
        seen.extend(prompts[:: args.num_generations])
        return reward(prompts, completions, **kwargs)

    recording_reward.__name__ = reward.__name__
    trainer = make_trainer(GRPOHubTrainer, model_dir, args, reward_funcs=[recording_reward], dataset=dataset)
    return trainer, seen


def trained_prompts(trainer) -> list[str]:
    """Decoded inputs of every forward pass run with gradients (the training forward)."""
    texts: list[str] = []

    def record(module, args, kwargs):
        if torch.is_grad_enabled():
            texts.extend(trainer.processing_class.batch_decode(kwargs["input_ids"], skip_special_tokens=True))

    trainer.model.register_forward_pre_hook(record, with_kwargs=True)
    return texts


def test_dynamic_sampling_trains_full_informative_batches_where_filtering_cannot(tmp_path, tiny_model_dir):
    plain, _ = degenerate_trainer(tmp_path, tiny_model_dir, filter_zero_signal=True, max_steps=3)
    plain.train()
    assert [entry["zero_signal/rows_trained"] for entry in step_logs(plain)] == [4.0, 4.0, 4.0]

    trainer, seen = degenerate_trainer(tmp_path, tiny_model_dir, dynamic_sampling=True, max_steps=3)
    forwards = trained_prompts(trainer)
    trainer.train()
    for entry in step_logs(trainer):
        assert (
            entry["dynamic_sampling/rows_trained"] == entry["zero_signal/rows_trained"] == 16.0
        )  # 4 groups x 4
        assert entry["dynamic_sampling/rounds"] == 3.0 and entry["dynamic_sampling/rows_generated"] == 64.0
        assert entry["dynamic_sampling/informative_frac"] == 0.25 and entry["dynamic_sampling/cap_hit"] == 0.0
    assert len(forwards) == 3 * 16 and all(text.startswith("Write only digits") for text in forwards)
    # the prompts were read in dataset order, each once: 3 steps x 4 generation batches x 4 prompts
    assert seen == list(degenerate_dataset(48)["prompt"])


def test_target_groups_and_the_cap_train_on_what_was_collected(tmp_path, tiny_model_dir):
    trainer, seen = degenerate_trainer(
        tmp_path,
        tiny_model_dir,
        dynamic_sampling=True,
        dynamic_sampling_target_groups=3,
        dynamic_sampling_max_rounds=1,
        max_steps=2,
    )
    trainer.train()
    for entry in step_logs(trainer):
        assert entry["dynamic_sampling/rounds"] == 1.0  # the cap
        assert entry["dynamic_sampling/cap_hit"] == 1.0
        assert (
            entry["dynamic_sampling/rows_trained"] == 8.0
        )  # the 2 informative groups found in 2 generation batches
    assert len(seen) == 2 * 2 * 4


def test_cap_can_raise_instead(tmp_path, tiny_model_dir):
    trainer, _ = degenerate_trainer(
        tmp_path,
        tiny_model_dir,
        dynamic_sampling=True,
        dynamic_sampling_max_rounds=1,
        dynamic_sampling_on_cap="error",
        max_steps=1,
    )
    with pytest.raises(RuntimeError, match="dynamic_sampling_max_rounds"):
        trainer.train()


def test_an_epoch_ends_when_refills_have_used_its_prompts(tmp_path, tiny_model_dir):
    """24 prompts = 6 generation batches; each step wants 4: step 2 gets the last 2 and the epoch is over."""
    trainer, seen = degenerate_trainer(
        tmp_path, tiny_model_dir, n_prompts=24, dynamic_sampling=True, max_steps=3
    )
    trainer.train()
    logs = step_logs(trainer)
    assert trainer.state.global_step == 2
    assert [entry["dynamic_sampling/data_exhausted"] for entry in logs] == [0.0, 1.0]
    assert [entry["dynamic_sampling/rows_trained"] for entry in logs] == [16.0, 8.0]
    assert seen == list(degenerate_dataset(24)["prompt"])


def test_without_zero_signal_groups_dynamic_sampling_changes_nothing(tmp_path, tiny_model_dir):
    def varied(prompts, completions, completion_ids, **kwargs):
        return [(sum(ids) % 7) / 7 for ids in completion_ids]

    weights = {}
    for dynamic in (False, True):
        args = tiny_config(tmp_path, **BATCH, filter_zero_signal=True, dynamic_sampling=dynamic, max_steps=2)
        trainer = make_trainer(GRPOHubTrainer, tiny_model_dir, args, reward_funcs=[varied])
        trainer.train()
        assert all(entry["zero_signal/rows_trained"] == 16.0 for entry in step_logs(trainer))
        weights[dynamic] = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    torch.testing.assert_close(weights[True], weights[False], rtol=0, atol=0)


@pytest.mark.slow
def test_reward_rises_with_dynamic_sampling_on_a_mostly_degenerate_task(tmp_path, tiny_model_dir):
    trainer, _ = degenerate_trainer(
        tmp_path,
        tiny_model_dir,
        n_prompts=1000,
        reward=mostly_flat_digit_reward,
        dynamic_sampling=True,
        max_steps=20,
        learning_rate=1e-2,
        max_completion_length=12,
    )
    trainer.train()
    logs = step_logs(trainer)
    assert all(entry["dynamic_sampling/rows_trained"] == 16.0 for entry in logs)
    digits = [entry["digits_reward"] for entry in logs]
    first, last = sum(digits[:5]) / 5, sum(digits[-5:]) / 5
    assert math.isfinite(first) and last > first + 0.15, digits


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"dynamic_sampling": True, "dynamic_sampling_max_rounds": -1}, "dynamic_sampling_max_rounds"),
        ({"dynamic_sampling": True, "dynamic_sampling_on_cap": "skip"}, "dynamic_sampling_on_cap"),
        ({"dynamic_sampling_target_groups": 4}, "dynamic_sampling_target_groups"),
        ({"dynamic_sampling": True, "dynamic_sampling_target_groups": 0}, "dynamic_sampling_target_groups"),
        (
            {"dynamic_sampling": True, "dynamic_sampling_max_rounds": 1, "dynamic_sampling_target_groups": 5},
            "dynamic_sampling_target_groups",
        ),
        ({"dynamic_sampling": True, "zero_signal_normalizer": "all"}, "zero_signal_normalizer"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_bad_dynamic_sampling_settings_name_the_field(tmp_path, overrides, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        tiny_config(tmp_path, **overrides)


def test_dynamic_sampling_implies_zero_signal_filtering(tmp_path):
    config = tiny_config(tmp_path, dynamic_sampling=True)
    assert isinstance(config, GRPOHubConfig) and config.filter_zero_signal
