"""GRPOHubConfig: TRL defaults kept, presets, CLI/YAML parsing, and a table of invalid configs."""

import dataclasses

import pytest
import trl
from trl import GRPOConfig, GRPOTrainer, TrlParser

from grpo_hub.training.compat import check_trl_seams, check_trl_version
from grpo_hub.training.config import GRPOHubConfig

BASE = {"output_dir": "/tmp/grpo_hub_test_config", "use_cpu": True, "bf16": False, "report_to": "none"}


def make(**kwargs) -> GRPOHubConfig:
    return GRPOHubConfig(**{**BASE, **kwargs})


def test_defaults_are_plain_trl():
    trl_dict = GRPOConfig(**BASE).to_dict()
    hub_dict = make().to_dict()
    assert {k: v for k, v in hub_dict.items() if k in trl_dict} == trl_dict
    new_fields = set(hub_dict) - set(trl_dict)
    assert new_fields, "GRPOHubConfig adds no fields"
    parent_names = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert not new_fields & parent_names


def test_every_new_field_documented():
    parent = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    for f in dataclasses.fields(GRPOHubConfig):
        if f.name not in parent or f.default != parent[f.name].default:
            assert len(f.metadata.get("help", "")) > 20, f.name


def test_gspo_preset():
    c = make(loss_type="gspo")
    assert (c.loss_type, c.importance_sampling_level) == ("grpo", "sequence")
    assert (c.epsilon, c.epsilon_high) == (3e-4, 4e-4)
    c = make(loss_type="gspo", epsilon=0.1)
    assert (c.epsilon, c.epsilon_high) == (0.1, None)


def test_cispo_preset_sets_documented_cap():
    assert make(loss_type="cispo").epsilon_high == 5.0
    assert make(loss_type="cispo", epsilon_high=3.0).epsilon_high == 3.0


def test_dual_clip_maps_onto_trl_delta():
    assert make(dual_clip_c=3.0).delta == 3.0


def test_adv_norm_mean_only_maps_onto_scale_rewards():
    assert make(adv_norm="mean_only").scale_rewards == "none"
    assert make(adv_norm="mean_std", scale_rewards="batch").scale_rewards == "batch"


def test_trl_parser_reads_yaml_and_cli(tmp_path):
    yaml_file = tmp_path / "config.yaml"
    yaml_file.write_text(
        "output_dir: /tmp/grpo_hub_test_config\nuse_cpu: true\nbf16: false\nloss_type: gspo\n"
        "filter_zero_signal: true\nzero_signal_eps: 0.01\nadv_clip_range: 5.0\nloss_agg_mode: seq-mean-token-mean\n"
    )
    (config,) = TrlParser((GRPOHubConfig,)).parse_args_and_config(
        ["--config", str(yaml_file), "--reward_norm", "batch", "--reward_shift", "true", "--dual_clip_c", "3"]
    )
    assert isinstance(config, GRPOHubConfig)
    assert (config.loss_type, config.importance_sampling_level, config.epsilon_high) == (
        "grpo",
        "sequence",
        4e-4,
    )
    assert config.filter_zero_signal and config.zero_signal_eps == 0.01 and config.adv_clip_range == 5.0
    assert (
        config.loss_agg_mode == "seq-mean-token-mean"
        and config.reward_norm == "batch"
        and config.reward_shift
    )
    assert config.delta == 3.0


def test_cli_error_names_field():
    with pytest.raises(ValueError, match="dual_clip_c"):
        TrlParser((GRPOHubConfig,)).parse_args_and_config(
            ["--output_dir", "/tmp/x", "--use_cpu", "true", "--bf16", "false", "--dual_clip_c", "0.5"]
        )


INVALID = [
    ("loss_type", {"loss_type": "ppo"}),
    ("importance_sampling_level", {"importance_sampling_level": "batch"}),
    ("importance_sampling_level", {"loss_type": "gspo", "importance_sampling_level": "token"}),
    ("importance_sampling_level", {"loss_type": "sapo", "importance_sampling_level": "turn"}),
    ("zero_signal_eps", {"filter_zero_signal": True, "zero_signal_eps": -0.1}),
    ("zero_signal_normalizer", {"filter_zero_signal": True, "zero_signal_normalizer": "some"}),
    ("filter_zero_signal", {"filter_zero_signal": True, "num_generations": 1}),
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
    ("entropy_coef", {"filter_zero_signal": True, "loss_type": "grpo", "entropy_coef": 0.01}),
    ("vllm_is_pooling", {"vllm_is_pooling": "max"}),
    ("vllm_is_pooling", {"vllm_is_pooling": "mean"}),
]


@pytest.mark.parametrize(
    ("field_name", "kwargs"), INVALID, ids=[f"{f}-{i}" for i, (f, _) in enumerate(INVALID)]
)
def test_invalid_config_names_the_field(field_name, kwargs):
    with pytest.raises(ValueError) as info:
        make(**kwargs)
    message = str(info.value)
    assert f"`{field_name}`" in message
    assert "Fix:" in message


def test_unsupported_trl_version_fails_with_install_hint(monkeypatch):
    check_trl_version()  # the installed TRL is supported
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(ImportError, match=r"trl>=1.16,<1.17"):
        check_trl_version()


def test_changed_trl_seam_signature_fails(monkeypatch):
    check_trl_seams(GRPOTrainer)

    class Moved(GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions):  # a parameter removed upstream
            return None

    with pytest.raises(ImportError, match="_calculate_rewards"):
        check_trl_seams(Moved)
