"""Scaffolding of the training wing's single-process tests: a run probed for its gradients and forwards, and the
feature switches' configs the compatibility and equivalence tests build."""

import torch
from transformers import TrainerCallback

from grpo_hub.training import features
from grpo_hub.training.config import GRPOHubConfig
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


# --- feature switches (grpo_hub.training.features) built on the tiny config ---
COMPAT_BASE = {
    "max_steps": 2,
    "per_device_train_batch_size": 8,
    "num_generations": 4,
    "shuffle_dataset": False,
}


def outcome(settings: dict, tmp_path="/tmp/grpo_hub_compat") -> GRPOHubConfig | ValueError:
    """The config `settings` build on COMPAT_BASE, or the ValueError that refuses them."""
    try:
        return tiny_config(tmp_path, **{**COMPAT_BASE, **settings})
    except ValueError as error:
        return error


def allowed(settings: dict) -> bool:
    return not isinstance(outcome(settings), ValueError)


def trains(name: str) -> bool:
    """Whether the switch's example trains on the tiny single-turn task here (not vLLM, not tool rollouts)."""
    switch = features.SWITCHES[name]
    return switch.trains and not switch.multi_turn


def _with_filtering(extra: dict, skip: tuple[str, ...]) -> list[str]:
    return [
        name
        for name, switch in features.SWITCHES.items()
        if trains(name)
        and not switch.needs_peft
        and name not in skip
        and allowed({**switch.example, "filter_zero_signal": True, **extra})
    ]


# switches the documented equivalences are checked with: packed == unpacked, 'all' == no filtering
PACKABLE = sorted(
    set(_with_filtering({"zero_signal_pack": True}, ("filtering", "packing")))
    & set(_with_filtering({"zero_signal_pack": False}, ("filtering", "packing"))),
    key=list(features.SWITCHES).index,
)
ALL_NORMALISER = _with_filtering(
    {"zero_signal_normalizer": "all"}, ("filtering", "packing", "dynamic_sampling")
)
