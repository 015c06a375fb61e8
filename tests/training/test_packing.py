"""Packing under filtering: fewer micro-steps run, the optimizer-step gradient is today's filtering gradient
(and, with zero_signal_normalizer="all", TRL's unfiltered one), across accumulation layouts."""

import pytest
import torch
from transformers import TrainerCallback

from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import half_signal_dataset, half_signal_reward, make_trainer, tiny_config
from tests.training.test_filtering import constant_reward

BASE = {
    "shuffle_dataset": False,
    "learning_rate": 0.0,
    "max_steps": 2,
}  # lr 0: every run sees the same rollouts


class StepProbe(TrainerCallback):
    """Flat gradient at every optimizer step, and the number of forwards that build a graph."""

    def __init__(self):
        self.grads, self.forwards = [], 0

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]))


def run(tmp_path, model_dir, reward=half_signal_reward, **overrides):
    args = tiny_config(tmp_path, **{**BASE, **overrides})
    probe = StepProbe()
    trainer = make_trainer(
        GRPOHubTrainer,
        model_dir,
        args,
        reward_funcs=[reward],
        dataset=half_signal_dataset(),
        callbacks=[probe],
    )

    def count(module, args, kwargs):
        probe.forwards += torch.is_grad_enabled()

    trainer.model.register_forward_pre_hook(count, with_kwargs=True)
    trainer.train()
    probe.logs = [h for h in trainer.state.log_history if "zero_signal/micro_steps_run" in h]
    return probe


LAYOUTS = {
    "steps=accumulation=2": {"gradient_accumulation_steps": 2},
    "num_iterations=2": {"gradient_accumulation_steps": 2, "num_iterations": 2},
    "steps=4,accumulation=2": {"gradient_accumulation_steps": 2, "steps_per_generation": 4},
    "steps=2,accumulation=4": {"gradient_accumulation_steps": 4, "steps_per_generation": 2, "max_steps": 1},
    "steps=3,accumulation=2": {"gradient_accumulation_steps": 2, "steps_per_generation": 3, "max_steps": 3},
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_packing_runs_fewer_micro_steps_with_the_same_gradient(tmp_path, tiny_model_dir, layout):
    thin = run(tmp_path, tiny_model_dir, filter_zero_signal=True, zero_signal_pack=False, **layout)
    packed = run(tmp_path, tiny_model_dir, filter_zero_signal=True, **layout)
    assert len(packed.grads) == len(thin.grads) == layout.get("max_steps", 2)
    assert packed.forwards < thin.forwards
    assert all(g.abs().sum() > 0 for g in thin.grads)
    for a, b in zip(packed.grads, thin.grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert packed.logs and not thin.logs


def test_all_filtered_batch_runs_one_pad_micro_step(tmp_path, tiny_model_dir):
    probe = run(
        tmp_path, tiny_model_dir, constant_reward, filter_zero_signal=True, gradient_accumulation_steps=2
    )
    assert probe.forwards == 2  # one per optimizer step (it ends the step), none for the empty micro-step
    assert all(g.abs().sum() == 0 for g in probe.grads)


def test_explicit_packing_that_cannot_apply_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="zero_signal_pack.*no effect without filter_zero_signal"):
        tiny_config(tmp_path, zero_signal_pack=True)
    with pytest.raises(ValueError, match="zero_signal_pack.*bnpo"):
        tiny_config(tmp_path, zero_signal_pack=True, filter_zero_signal=True, loss_type="bnpo")
    assert not tiny_config(tmp_path, filter_zero_signal=True, loss_type="bnpo").packs_rows
    assert tiny_config(tmp_path, filter_zero_signal=True).packs_rows
    # issue 25, defect 2: TRL's entropy bonus is a token mean per micro-batch, so packing would change it
    assert not tiny_config(tmp_path, filter_zero_signal=True, entropy_coef=0.01).packs_rows
    with pytest.raises(ValueError, match="`zero_signal_pack` with `entropy_coef`"):
        tiny_config(tmp_path, filter_zero_signal=True, zero_signal_pack=True, entropy_coef=0.01)
