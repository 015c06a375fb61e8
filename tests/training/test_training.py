"""Short GRPO runs on the built-in task: every loss variant must raise the mean reward.

A zero or reversed gradient leaves the reward flat or lowers it, so these fail when a variant's wiring
breaks. num_iterations=2 makes the second pass off-policy, so the clip / dual-clip / CISPO bounds act.
"""

import pytest

from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import make_trainer, tiny_config

VARIANTS = {
    "dapo": {},
    "grpo": {"loss_type": "grpo"},
    "gspo": {"loss_type": "gspo"},
    "cispo": {"loss_type": "cispo"},
    "dual-clip": {"dual_clip_c": 3.0},
    "agg-token-mean": {"loss_type": "grpo", "loss_agg_mode": "token-mean"},
    "agg-seq-mean-token-sum": {"loss_type": "grpo", "loss_agg_mode": "seq-mean-token-sum"},
    "agg-seq-mean-token-mean": {"loss_type": "grpo", "loss_agg_mode": "seq-mean-token-mean"},
    "agg-seq-mean-token-sum-norm": {"loss_type": "grpo", "loss_agg_mode": "seq-mean-token-sum-norm"},
    "filter-dapo": {"filter_zero_signal": True},
    "filter-grpo-all": {"loss_type": "grpo", "filter_zero_signal": True, "zero_signal_normalizer": "all"},
    "reward-and-adv-transforms": {
        "reward_norm": "batch",
        "reward_clip": 3.0,
        "whiten_advantages": True,
        "adv_clip_range": 2.0,
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_short_run_raises_mean_reward(tmp_path, tiny_model_dir, name):
    args = tiny_config(tmp_path, max_steps=24, num_iterations=2, learning_rate=3e-2, **VARIANTS[name])
    trainer = make_trainer(GRPOHubTrainer, tiny_model_dir, args)
    trainer.train()
    key = "reward_raw" if args.reward_norm else "reward"
    rewards = [h[key] for h in trainer.state.log_history if key in h]
    assert len(rewards) == 12  # one scored batch every num_iterations steps
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.15, (first, last)
