"""GRPOHubTrainer logs the share of zero-signal groups at the top and at the bottom of the reward range."""

import pytest
from datasets import Dataset

from grpo_hub import GRPOHubTrainer
from tests.helpers import make_trainer, tiny_config


def solved_unsolved_open_reward(prompts, completions, completion_ids, **kwargs):
    """1.0 for "solved" prompts, 0.0 for "unsolved" ones, a completion-dependent value for "open" ones."""
    values = {"solved": lambda ids: 1.0, "unsolved": lambda ids: 0.0, "open": lambda ids: (sum(ids) % 7) / 7}
    return [values[p.split()[0]](ids) for p, ids in zip(prompts, completion_ids, strict=True)]


def test_all_max_and_all_min_groups_are_logged_apart(tiny_model_dir, tmp_path):
    dataset = Dataset.from_dict(
        {"prompt": [f"{kind} {i}" for i in range(4) for kind in ("solved", "unsolved", "open")]}
    )
    args = tiny_config(tmp_path, per_device_train_batch_size=12, max_steps=2, shuffle_dataset=False)
    trainer = make_trainer(
        GRPOHubTrainer, tiny_model_dir, args, reward_funcs=[solved_unsolved_open_reward], dataset=dataset
    )
    trainer.train()
    metrics = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert [m["zero_signal/frac_groups_all_max"] for m in metrics] == pytest.approx([1 / 3, 1 / 3])
    assert [m["zero_signal/frac_groups_all_min"] for m in metrics] == pytest.approx([1 / 3, 1 / 3])
    assert [m["frac_reward_zero_std"] for m in metrics] == pytest.approx(
        [2 / 3, 2 / 3]
    )  # TRL's total: both kinds
