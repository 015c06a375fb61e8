"""Scaffolding of the training wing's single-process tests: a run probed for its gradients and forwards."""

import torch
from transformers import TrainerCallback

from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import half_signal_dataset, half_signal_reward, make_trainer, tiny_config

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


def run(tmp_path, model_dir, reward=half_signal_reward, **overrides) -> StepProbe:
    """Train `tiny_config` + BASE + `overrides` on the half-signal data; the probe holds each optimizer step's
    gradient, the graph-building forwards and the packing logs."""
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
