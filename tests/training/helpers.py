"""Scaffolding of the training wing's single-process tests: a run probed for its gradients and forwards, and the
feature switches' configs the compatibility and equivalence tests build."""

import math

import torch
from transformers import TrainerCallback

from grpo_hub.config import features
from grpo_hub.config.hub_config import GRPOHubConfig
from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import half_signal_dataset, half_signal_reward, make_trainer, tiny_config

BASE = {
    "shuffle_dataset": False,
    "learning_rate": 0.0,
    "max_steps": 2,
}  # lr 0: every run sees the same rollouts


class StepProbe(TrainerCallback):
    """Flat gradient at every optimizer step, the number of forwards that build a graph, and the tokens of every
    scoring forward (those given labels: training, TRL's scoring, reference, rescoring; not generation)."""

    def __init__(self):
        self.grads, self.forwards, self.scored_tokens = [], 0, 0

    def count(self, module, args, kwargs):
        """Forward pre-hook (with_kwargs) of the trained model."""
        self.forwards += torch.is_grad_enabled()
        if "labels" in kwargs:
            self.scored_tokens += kwargs["input_ids"].numel()

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]))


def run(tmp_path, model_dir, reward=half_signal_reward, peft_config=None, **overrides) -> StepProbe:
    """Train `tiny_config` + BASE + `overrides` on the half-signal data (a LoRA adapter with `peft_config`); the probe
    holds each optimizer step's gradient, the forwards and their tokens, the packing logs and the trainer."""
    args = tiny_config(tmp_path, **{**BASE, **overrides})
    probe = StepProbe()
    trainer = make_trainer(
        GRPOHubTrainer,
        model_dir,
        args,
        reward_funcs=[reward],
        dataset=half_signal_dataset(),
        callbacks=[probe],
        peft_config=peft_config,
    )

    trainer.model.register_forward_pre_hook(probe.count, with_kwargs=True)
    trainer.train()
    probe.logs = [h for h in trainer.state.log_history if "zero_signal/micro_steps_run" in h]
    probe.trainer = trainer
    return probe


# --- feature switches (grpo_hub.config.features) built on the tiny config ---
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


# At least one out-of-range or unsupported value for every field GRPOHubConfig declares, with the field its error
# names (test_config.py checks the coverage; the recipe's bad-input suite feeds each one through the recipe).
INVALID = [
    ("loss_type", {"loss_type": "ppo"}),
    ("num_generations", {"num_generations": 1}),  # TRL refuses it too, without naming the field
    ("loss_type", {"loss_type": "ppo", "filter_zero_signal": True}),  # resolution leaves it to validation
    ("importance_sampling_level", {"importance_sampling_level": "batch"}),
    ("importance_sampling_level", {"loss_type": "gspo", "importance_sampling_level": "token"}),
    ("importance_sampling_level", {"loss_type": "sapo", "importance_sampling_level": "turn"}),
    ("zero_signal_eps", {"filter_zero_signal": True, "zero_signal_eps": -0.1}),
    ("zero_signal_normalizer", {"filter_zero_signal": True, "zero_signal_normalizer": "some"}),
    # zero-spread groups that still carry advantages (issue 25, defect 5): skipping them would change the gradient
    ("filter_zero_signal", {"filter_zero_signal": True, "whiten_advantages": True}),
    ("dynamic_sampling", {"dynamic_sampling": True, "adv_norm": "no_baseline"}),
    ("selective_rollout", {"selective_rollout": True, "turn_advantages": "turn"}),
    (
        "multi_objective_aggregation",
        {"filter_zero_signal": True, "multi_objective_aggregation": "normalize_then_sum"},
    ),
    ("epsilon", {"epsilon": -0.1}),
    ("epsilon_high", {"epsilon_high": -0.2}),
    ("epsilon", {"epsilon": 1.5}),
    ("epsilon_high", {"loss_type": "cispo", "epsilon_high": 0.2}),
    ("dual_clip_c", {"dual_clip_c": 0.9}),
    ("dual_clip_c", {"dual_clip_c": 1.1}),
    ("dual_clip_c", {"dual_clip_c": 3.0, "loss_type": "cispo"}),
    ("dual_clip_c", {"dual_clip_c": 3.0, "delta": 4.0}),
    ("loss_agg_mode", {"loss_agg_mode": "token-sum"}),
    ("loss_agg_mode", {"loss_agg_mode": "token-mean", "loss_type": "bnpo"}),
    ("loss_agg_mode", {"loss_agg_mode": "token-mean", "loss_type": "dr_grpo"}),
    ("off_policy_mask_threshold", {"loss_agg_mode": "token-mean", "off_policy_mask_threshold": 0.5}),
    ("top_entropy_quantile", {"importance_sampling_level": "turn", "top_entropy_quantile": 0.2}),
    ("entropy_coef", {"loss_agg_mode": "seq-mean-token-mean", "entropy_coef": 0.01}),
    ("reward_clip", {"reward_clip": 0.0}),
    ("reward_norm", {"reward_norm": "group"}),
    ("reward_shift", {"reward_shift": True}),
    ("reward_scale", {"reward_scale": True}),
    ("reward_shift", {"reward_norm": "batch", "reward_shift": True, "reward_scale": True}),
    ("token_level_kl_coef", {"token_level_kl_coef": -0.01}),
    ("adv_norm", {"adv_norm": "std"}),
    ("adv_norm", {"adv_norm": "mean_std", "scale_rewards": "none"}),
    ("adv_norm", {"adv_norm": "mean_only", "scale_rewards": "batch"}),
    ("adv_clip_range", {"adv_clip_range": -1.0}),
    (
        "multi_objective_aggregation",
        {"whiten_advantages": True, "multi_objective_aggregation": "normalize_then_sum"},
    ),
    # the refusal names the advantage edit that is set, not always whiten_advantages
    ("adv_clip_range", {"adv_clip_range": 1.0, "multi_objective_aggregation": "normalize_then_sum"}),
    ("entropy_coef", {"filter_zero_signal": True, "loss_type": "grpo", "entropy_coef": 0.01}),
    # issue 25, defect 1: dynamic sampling implies filtering before the checks run, so it is refused alike
    ("entropy_coef", {"dynamic_sampling": True, "loss_type": "grpo", "entropy_coef": 0.01}),
    ("dynamic_sampling", {"dynamic_sampling": True, "loss_type": "grpo", "entropy_coef": 0.01}),
    ("vllm_is_pooling", {"vllm_is_pooling": "max"}),
    ("vllm_is_pooling", {"vllm_is_pooling": "mean"}),
    (
        "vllm_is_pooling",
        {"vllm_is_pooling": "mean", "use_vllm": True, "vllm_importance_sampling_mode": "token_mask"},
    ),
    ("vllm_is_preset", {"vllm_is_preset": "verl", "use_vllm": True}),
    (
        "vllm_adapter_sync",
        {"vllm_adapter_sync": True, "use_vllm": True, "vllm_mode": "server", "vllm_server_sync": "merged"},
    ),
    ("vllm_server_sync", {"use_vllm": True, "vllm_mode": "server", "vllm_server_sync": "tcp"}),
    (
        "vllm_adapter_sync",
        {"vllm_adapter_sync": True, "use_vllm": True, "vllm_mode": "server", "vllm_server_sync": "nccl"},
    ),
    (
        "max_staleness",
        {"use_vllm": True, "vllm_mode": "server", "max_staleness": 1, "vllm_server_sync": "nccl"},
    ),
    ("vllm_server_sync", {"vllm_server_sync": "merged"}),  # colocate: no effect
    ("vllm_server_sync_dir", {"vllm_server_sync_dir": "/tmp/sync"}),
    ("max_staleness", {"use_vllm": True, "vllm_mode": "server", "max_staleness": -1}),
    ("max_staleness", {"max_staleness": 1}),  # no server
    (
        "max_staleness",
        {
            "use_vllm": True,
            "vllm_mode": "server",
            "max_staleness": 1,
            "vllm_importance_sampling_correction": False,
        },
    ),
    (
        "max_staleness",
        {"use_vllm": True, "vllm_mode": "server", "max_staleness": 1, "selective_rollout": True},
    ),
    (
        "padding_free",
        {"padding_free": True, "model_init_kwargs": {"attn_implementation": "flash_attention_2"}},
    ),
    ("shared_prompts", {"padding_free": False, "shared_prompts": True}),  # no effect without padding_free
    (
        "shared_prompts_whole_groups",
        {"padding_free": True, "shared_prompts": True, "shared_prompts_whole_groups": True},
    ),
    (
        "shared_prompts_whole_groups",
        {
            "padding_free": True,
            "shared_prompts": True,
            "shared_prompts_whole_groups": True,
            "gradient_accumulation_steps": 3,
            "steps_per_generation": 2,
        },
    ),  # gcd 1: no effect
    ("time_budget_seconds", {"time_budget_seconds": -60.0}),
    (
        "time_budget_seconds",
        {
            "time_budget_seconds": 60.0,
            "lr_scheduler_type": "greedy",
            "eval_strategy": "steps",
            "eval_steps": 1,
        },
    ),
    ("time_budget_calibration_steps", {"time_budget_seconds": 60.0, "time_budget_calibration_steps": 1}),
    ("dynamic_sampling_max_rounds", {"dynamic_sampling": True, "dynamic_sampling_max_rounds": -1}),
    ("dynamic_sampling_on_cap", {"dynamic_sampling": True, "dynamic_sampling_on_cap": "skip"}),
    ("selective_rollout_mode", {"selective_rollout": True, "selective_rollout_mode": "drop"}),
    ("selective_rollout_mode", {"selective_rollout_mode": "shrink"}),  # no effect without selective_rollout
    ("dynamic_sampling_target_groups", {"dynamic_sampling": True, "dynamic_sampling_target_groups": 0}),
    ("turn_advantages", {"turn_advantages": "step"}),
    ("whiten_advantages", {"turn_advantages": "turn", "whiten_advantages": True}),
    ("ref_adapter_sync_on", {"ref_adapter_sync_on": "always", "beta": 0.1}),
    ("ref_adapter_sync_on", {"ref_adapter_sync_on": "steps"}),  # beta = 0: no reference log-probs
    ("ref_adapter_sync_on", {"ref_adapter_sync_on": "steps", "beta": 0.1, "sync_ref_model": True}),
    ("ref_adapter_keep", {"ref_adapter_keep": True}),  # beta = 0
    ("ref_adapter_sync_steps", {"ref_adapter_sync_on": "steps", "beta": 0.1, "ref_adapter_sync_steps": 0}),
    (
        "ref_adapter_mixup_alpha",
        {"ref_adapter_sync_on": "steps", "beta": 0.1, "ref_adapter_mixup_alpha": 1.5},
    ),
    ("ref_adapter_save", {"ref_adapter_save": True}),  # beta = 0: there is no 'ref' adapter to keep
    # NaN passes every `<` / `<=` range check (issue 15): each bound is checked for finiteness first.
    ("reward_clip", {"reward_clip": math.nan}),
    ("adv_clip_range", {"adv_clip_range": math.nan}),
    ("dual_clip_c", {"dual_clip_c": math.nan}),
    ("epsilon", {"epsilon": math.nan}),
    ("delta", {"delta": math.nan}),
    ("zero_signal_pack", {"zero_signal_pack": True, "filter_zero_signal": True, "loss_type": "bnpo"}),
    ("reward_norm", {"selective_rollout": True, "reward_norm": "batch"}),
    ("selective_rollout_id_column", {"selective_rollout_id_column": "id"}),  # feature off
    ("rollout_budget", {"rollout_budget": "adaptive"}),
    ("rollout_budget_min", {"rollout_budget": "knapsack", "rollout_budget_min": 1}),
    ("rollout_budget_min", {"rollout_budget": "knapsack", "rollout_budget_min": 2.5}),
    ("rollout_budget_min", {"rollout_budget": "knapsack", "rollout_budget_min": 64}),  # above num_generations
    ("rollout_budget_max", {"rollout_budget": "knapsack", "rollout_budget_max": 2}),  # below num_generations
    ("rollout_budget_max", {"rollout_budget_max": 16}),  # feature off
    ("rollout_budget_column", {"rollout_budget_column": "level"}),  # feature off
    (
        "rollout_budget_success_threshold",
        {"rollout_budget": "knapsack", "rollout_budget_success_threshold": math.inf},
    ),
    ("rollout_budget_success_threshold", {"rollout_budget_success_threshold": 0.5}),  # feature off
    ("hint_column", {"hint_column": ""}),
    ("hint_separator", {"hint_column": "solution", "hint_separator": ""}),
    ("hint_separator", {"hint_separator": ","}),  # feature off
    ("hint_group_column", {"hint_group_column": "level"}),  # feature off
    ("hint_success_threshold", {"hint_column": "solution", "hint_success_threshold": math.inf}),
    ("hint_shorten_at", {"hint_column": "solution", "hint_shorten_at": 0.0}),
    ("hint_shorten_at", {"hint_column": "solution", "hint_shorten_at": 1.5}),
    ("hint_window", {"hint_column": "solution", "hint_window": 0}),
    ("hint_window", {"hint_column": "solution", "hint_window": 2.5}),
    ("hint_end", {"hint_column": "solution", "hint_end": 0.0}),
    ("hint_end", {"hint_end": 0.5}),  # feature off
    (
        "selective_rollout_target_zero_frac",
        {"selective_rollout": True, "selective_rollout_target_zero_frac": 1.5},
    ),
    ("selective_rollout_explore_init", {"selective_rollout": True, "selective_rollout_explore_init": 0.99}),
    ("selective_rollout_explore_step", {"selective_rollout": True, "selective_rollout_explore_step": -0.1}),
    ("selective_rollout_min_keep_prob", {"selective_rollout": True, "selective_rollout_min_keep_prob": 0.0}),
    ("selective_rollout_revisit_after", {"selective_rollout": True, "selective_rollout_revisit_after": 0}),
    ("selective_rollout_revisit_after", {"selective_rollout": True, "selective_rollout_revisit_after": 1.5}),
    (
        "selective_rollout_reward_min",
        {"selective_rollout": True, "selective_rollout_reward_min": 1.0, "selective_rollout_reward_max": 0.0},
    ),
    ("selective_rollout_reward_max", {"selective_rollout_reward_max": 1.0}),  # feature off
]
