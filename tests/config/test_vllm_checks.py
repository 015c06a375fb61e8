"""Config-time vLLM IS rules (preset, bounds, sampler/trainer agreement) and the diagnostics' sums; no vLLM needed."""

import math

import pytest
import torch

from grpo_hub.config.hub_config import GRPOHubConfig
from grpo_hub.generation.is_diagnostics import local_is_sums
from grpo_hub.generation.server import check_server_logprobs_mode

CPU = {"use_cpu": True, "bf16": False, "report_to": "none"}


def vllm_config(tmp_path, **overrides) -> GRPOHubConfig:
    return GRPOHubConfig(output_dir=str(tmp_path), use_vllm=True, **CPU, **overrides)


def test_agilerl_preset_is_token_truncate_capped_at_two(tmp_path):
    config = vllm_config(tmp_path, vllm_is_preset="agilerl")
    assert config.vllm_importance_sampling_mode == "token_truncate"
    assert config.vllm_importance_sampling_clip_max == 2.0
    assert config.vllm_importance_sampling_clip_min is None
    assert vllm_config(tmp_path).vllm_importance_sampling_mode == "sequence_mask"  # TRL's default untouched


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"vllm_is_preset": "verl"}, "vllm_is_preset"),
        (
            {"vllm_is_preset": "agilerl", "vllm_importance_sampling_mode": "sequence_truncate"},
            "vllm_importance_sampling_mode",
        ),
        (
            {"vllm_is_preset": "agilerl", "vllm_importance_sampling_clip_min": 0.5},
            "vllm_importance_sampling_clip_min",
        ),
        (
            {"vllm_is_preset": "agilerl", "vllm_importance_sampling_clip_max": 5.0},
            "vllm_importance_sampling_clip_max",
        ),
        ({"vllm_importance_sampling_clip_max": 0.0}, "vllm_importance_sampling_clip_max"),
        ({"vllm_importance_sampling_clip_max": -1.0}, "vllm_importance_sampling_clip_max"),
        ({"vllm_importance_sampling_clip_min": 0.0}, "vllm_importance_sampling_clip_min"),
        (
            {"vllm_importance_sampling_clip_min": 2.0, "vllm_importance_sampling_clip_max": 2.0},
            "vllm_importance_sampling_clip_min",
        ),
    ],
)
def test_bad_preset_or_bounds_name_the_field(tmp_path, overrides, field):
    with pytest.raises(ValueError, match=f"`{field}`.*Fix:"):
        vllm_config(tmp_path, **overrides)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"top_p": 0.9}, "top_p"),
        ({"top_k": 50}, "top_k"),
        ({"min_p": 0.05}, "min_p"),
        ({"repetition_penalty": 1.1}, "repetition_penalty"),
        ({"temperature": 0.005}, "temperature"),
        ({"generation_kwargs": {"temperature": 0.7}}, "generation_kwargs"),
        ({"generation_kwargs": {"top_p": 0.95}}, "generation_kwargs"),
        ({"generation_kwargs": {"presence_penalty": 0.5}}, "generation_kwargs"),
        ({"generation_kwargs": {"min_tokens": 4}}, "generation_kwargs"),
        ({"vllm_structured_outputs_regex": "[0-9]+"}, "vllm_structured_outputs_regex"),
        (
            {"top_p": 0.9, "vllm_importance_sampling_correction": False, "off_policy_mask_threshold": 0.5},
            "top_p",
        ),
    ],
)
def test_sampler_settings_that_bias_the_ratio_are_rejected(tmp_path, overrides, field):
    with pytest.raises(ValueError, match=f"`{field}`.*Fix:"):
        vllm_config(tmp_path, **overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        {
            "temperature": 0.7,
            "top_k": -1,
            "generation_kwargs": {"temperature": 0.7, "top_p": 1.0, "max_tokens": 8},
        },
        {
            "top_p": 0.9,
            "vllm_importance_sampling_correction": False,
        },  # nothing compares the two distributions
        {"top_p": 0.9, "use_vllm": False},
    ],
)
def test_settings_that_keep_one_distribution_pass(tmp_path, overrides):
    settings = {"use_vllm": True, **overrides}
    config = GRPOHubConfig(output_dir=str(tmp_path), **CPU, **settings)
    assert config.top_p == overrides.get("top_p", 1.0)


def naive_sums(trainer, sampler, mask, level, pooling, low, high):
    """Loop over rows and tokens: the eight sums local_is_sums returns, plus max |Δ|."""
    abs_sum = k1 = k3 = tokens = units = outside = weight_sum = weight_square_sum = 0.0
    abs_max = 0.0
    for row in range(trainer.shape[0]):
        deltas = []
        for t in range(trainer.shape[1]):
            if mask[row, t] and not math.isnan(sampler[row, t]):
                d = trainer[row, t].item() - sampler[row, t].item()
                deltas.append(d)
                abs_sum, abs_max = abs_sum + abs(d), max(abs_max, abs(d))
                k1 -= d
                k3 += math.exp(d) - 1 - d
        tokens += len(deltas)
        if level == "token":  # a token vLLM did not score is a unit of weight 1
            unscored = sum(bool(m) for m in mask[row]) - len(deltas)
            weights = [math.exp(d) for d in deltas] + [1.0] * unscored
            units += len(weights)
        else:
            pooled = sum(deltas) / max(len(deltas), 1) if pooling == "mean" else sum(deltas)
            weights = [math.exp(pooled)] if any(mask[row]) else []
            units += len(weights)
        outside += sum((low is not None and w < low) or (high is not None and w > high) for w in weights)
        weight_sum += sum(weights)
        weight_square_sum += sum(w * w for w in weights)
    return [abs_sum, k1, k3, tokens, units, outside, weight_sum, weight_square_sum, abs_max]


@pytest.mark.parametrize(
    ("level", "pooling", "low", "high"),
    [
        ("token", "sum", None, 1.05),
        ("token", "sum", 0.95, 1.05),
        ("sequence", "sum", 0.9, 1.1),
        ("sequence", "mean", 0.97, None),
    ],
)
def test_local_is_sums_match_a_loop(level, pooling, low, high):
    generator = torch.Generator().manual_seed(0)
    trainer = -torch.rand(4, 6, generator=generator, dtype=torch.float64) * 3
    sampler = trainer + torch.randn(4, 6, generator=generator, dtype=torch.float64) * 0.1
    sampler[1, 2] = float("nan")  # a token vLLM did not score
    mask = torch.ones(4, 6, dtype=torch.long)
    mask[2, 4:] = 0
    mask[3] = 0  # an empty row is no sequence unit
    got = local_is_sums(trainer, sampler, mask, level=level, pooling=pooling, low=low, high=high)
    expected = naive_sums(trainer, sampler, mask, level, pooling, low, high)
    assert got.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert 0 < got[5] < got[4]  # the bounds were chosen so that some, not all, units are out of range


def server_info(logprobs_mode: str) -> dict:
    """The part of vLLM's /server_info the check reads."""
    return {"model_config": {"logprobs_mode": logprobs_mode}}


@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits", "processed_logits"])
def test_server_with_other_logprobs_mode_is_rejected(mode):
    with pytest.raises(ValueError, match=f"`vllm_mode`.*{mode}.*Fix:"):
        check_server_logprobs_mode(server_info(mode))


def test_server_with_processed_logprobs_passes():
    check_server_logprobs_mode(server_info("processed_logprobs"))
