"""GRPOHubConfig: TRL defaults kept, presets, CLI/YAML parsing, and invalid values for every field.

`INVALID` (tests/training/helpers.py) holds at least one out-of-range or unsupported value for every field GRPOHubConfig declares (checked by
`test_every_field_has_an_invalid_case`, so a new field cannot be forgotten); wrong types, non-finite floats, NaN in
TRL's float fields and effect-less settings are generated from the dataclass and `EFFECT_NEEDS`.
"""

import dataclasses
import inspect
import math

import pytest
import trl
from trl import GRPOConfig, GRPOTrainer, TrlParser

from grpo_hub.config import features
from grpo_hub.config.hub_config import EFFECT_NEEDS, GRPOHubConfig
from grpo_hub.config.trl_version import check_trl_version
from grpo_hub.config.validation import _allowed_types
from grpo_hub.training.compat import check_trl_seams
from tests.training.helpers import INVALID, outcome

OWN_FIELDS = inspect.get_annotations(GRPOHubConfig)

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


def test_adv_norm_none_is_a_deprecated_name_of_no_baseline():
    with pytest.warns(FutureWarning, match="no_baseline"):
        assert make(adv_norm="none").adv_norm == "no_baseline"


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


def test_every_field_has_an_invalid_case():
    assert set(OWN_FIELDS) <= {name for name, _ in INVALID}


def _wrong_type(annotation):
    """A value of a type the annotation does not allow: a string for numbers and bools, a number for strings."""
    return 1.5 if str in _allowed_types(annotation) else "1"


@pytest.mark.parametrize("name", sorted(OWN_FIELDS))
def test_wrong_type_names_the_field(name):
    with pytest.raises(ValueError, match=rf"^`{name}`: must be .*, got str|^`{name}`: must be .*, got float"):
        make(**{name: _wrong_type(OWN_FIELDS[name])})


FLOAT_FIELDS = sorted(name for name, annotation in OWN_FIELDS.items() if float in _allowed_types(annotation))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_non_finite_float_names_the_field(name, value):
    with pytest.raises(ValueError, match=rf"^`{name}`: must be a finite number"):
        make(**{name: value})


TRL_FLOAT_FIELDS = sorted(
    f.name
    for f in dataclasses.fields(GRPOConfig)
    if f.name not in OWN_FIELDS and (isinstance(f.default, float) or "float" in str(f.type))
)


@pytest.mark.parametrize("name", TRL_FLOAT_FIELDS)
def test_nan_in_any_trl_float_field_names_it(name):
    with pytest.raises(ValueError, match=rf"^`{name}`: "):
        make(**{name: math.nan})


# A value away from the default, and the setting that gives it an effect (accepted with it, rejected without).
EFFECTIVE = {
    "time_budget_calibration_steps": (8, {"time_budget_seconds": 60.0}),
    "zero_signal_eps": (0.1, {"filter_zero_signal": True}),
    "zero_signal_normalizer": ("all", {"filter_zero_signal": True}),
    "dynamic_sampling_target_groups": (2, {"dynamic_sampling": True}),
    "dynamic_sampling_max_rounds": (8, {"dynamic_sampling": True}),
    "dynamic_sampling_on_cap": ("error", {"dynamic_sampling": True}),
    "reward_shift": (True, {"reward_norm": "batch"}),
    "reward_scale": (True, {"reward_norm": "batch"}),
    "vllm_is_pooling": (
        "mean",
        {"use_vllm": True, "vllm_importance_sampling_mode": "sequence_truncate"},
    ),
    "vllm_is_preset": ("agilerl", {"use_vllm": True}),
    "vllm_adapter_sync": (True, {"use_vllm": True}),
    "vllm_server_sync": ("merged", {"use_vllm": True, "vllm_mode": "server"}),
    "vllm_server_sync_dir": ("/tmp/sync", {"use_vllm": True, "vllm_mode": "server"}),
    "max_staleness": (1, {"use_vllm": True, "vllm_mode": "server"}),
    "ref_adapter_sync_steps": (10, {"ref_adapter_sync_on": "steps", "beta": 0.1}),
    "ref_adapter_mixup_alpha": (0.5, {"ref_adapter_sync_on": "epoch", "beta": 0.1}),
    "ref_adapter_save": (True, {"beta": 0.1}),
    "zero_signal_pack": (False, {"filter_zero_signal": True}),
    "selective_rollout_mode": ("shrink", {"selective_rollout": True}),
    "selective_rollout_id_column": ("id", {"selective_rollout": True}),
    "selective_rollout_target_zero_frac": (0.5, {"selective_rollout": True}),
    "selective_rollout_explore_init": (0.7, {"selective_rollout": True}),
    "selective_rollout_explore_step": (0.05, {"selective_rollout": True}),
    "selective_rollout_min_keep_prob": (0.1, {"selective_rollout": True}),
    "selective_rollout_revisit_after": (2, {"selective_rollout": True}),
    "selective_rollout_reward_min": (0.0, {"selective_rollout": True}),
    "selective_rollout_reward_max": (1.0, {"selective_rollout": True}),
    "rollout_budget_min": (3, {"rollout_budget": "knapsack"}),
    "rollout_budget_max": (16, {"rollout_budget": "knapsack"}),
    "rollout_budget_column": ("level", {"rollout_budget": "knapsack"}),
    "rollout_budget_success_threshold": (0.5, {"rollout_budget": "knapsack"}),
    "hint_separator": (",", {"hint_column": "solution"}),
    "hint_group_column": ("level", {"hint_column": "solution"}),
    "hint_success_threshold": (0.5, {"hint_column": "solution"}),
    "hint_shorten_at": (0.25, {"hint_column": "solution"}),
    "hint_window": (16, {"hint_column": "solution"}),
    "hint_end": (0.5, {"hint_column": "solution"}),
    "shared_prompts": (True, {"padding_free": True}),
    "shared_prompts_whole_groups": (
        True,
        {"padding_free": True, "shared_prompts": True, "gradient_accumulation_steps": 2},
    ),
}


def test_every_effect_rule_has_a_case():
    assert set(EFFECTIVE) == set(EFFECT_NEEDS)


@pytest.mark.parametrize("name", sorted(EFFECTIVE))
def test_effectless_setting_is_rejected_and_accepted_with_its_switch(name):
    value, switch = EFFECTIVE[name]
    assert getattr(make(**{name: value}, **switch), name) == value
    with pytest.raises(ValueError, match=rf"^`{name}`: is set to {value!r} but has no effect without "):
        make(**{name: value})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ref_adapter_sync_steps": 10, "ref_adapter_sync_on": "epoch", "beta": 0.1},
        {"ref_adapter_mixup_alpha": 0.5, "ref_adapter_sync_on": "never"},
        {"vllm_is_preset": "agilerl", "use_vllm": True, "vllm_importance_sampling_correction": False},
        {"zero_signal_eps": 0.1, "reward_norm": "batch"},
    ],
)
def test_issue_15_effectless_examples(kwargs):
    with pytest.raises(ValueError, match="has no effect without"):
        make(**kwargs)


def test_default_valued_field_counts_as_unset():
    """`explicitly set` means `differs from the default`: a default value is accepted whatever the switches."""
    assert make(ref_adapter_sync_steps=64, zero_signal_eps=0.0, dynamic_sampling_max_rounds=4)


def test_an_invalid_value_next_to_any_switch_is_a_value_error():
    """Resolution runs before validation: an invalid value must still end in the ValueError that names it,
    never in a KeyError or TypeError from a resolution step, whatever switch is on beside it."""
    for name, kwargs in INVALID:
        for feature in features.SWITCHES.values():
            result = outcome({**feature.example, **kwargs})  # any exception but ValueError propagates
            assert isinstance(result, ValueError | GRPOHubConfig), (name, feature.name)


def test_the_old_import_path_warns_and_gives_the_same_class():
    import importlib
    import sys

    sys.modules.pop("grpo_hub.training.config", None)
    with pytest.warns(DeprecationWarning, match="moved to grpo_hub.config.hub_config"):
        old = importlib.import_module("grpo_hub.training.config")
    assert old.GRPOHubConfig is GRPOHubConfig
