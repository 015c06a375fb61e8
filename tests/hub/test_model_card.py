"""Model card pieces: metadata that validates, the config that matters (no tokens), metrics, reward curve."""

from __future__ import annotations

import io

import pytest

from grpo_hub.hub.model_card import (
    build_model_card,
    final_metrics,
    loss_variant,
    reward_curve_png,
    training_config,
)
from tests.hub.fake_hub import validate_card_yaml

pytestmark = pytest.mark.hub
LOG = [
    {"reward": 0.1, "reward_std": 0.05, "rewards/a/mean": 0.1, "rewards/b/mean": 0.0, "loss": 0.3, "step": 1},
    {"reward": 0.6, "reward_std": 0.10, "rewards/a/mean": 0.5, "rewards/b/mean": 0.1, "loss": 0.2, "step": 2},
    {"train_runtime": 1.5, "train_loss": 0.25, "step": 2},
]


def _card(base_model, config=None):
    return build_model_card(
        repo_id="alice/x",
        revision="step-2",
        base_model=base_model,
        config=config or {"loss_type": "cispo"},
        metrics=final_metrics(LOG),
        step=2,
        has_curve=True,
    )


def test_card_metadata_validates_and_only_names_hub_base_models(tmp_path):
    hub_card, local_card = _card("Qwen/Qwen2-0.5B"), _card(str(tmp_path))
    assert validate_card_yaml(str(hub_card)) == [] and validate_card_yaml(str(local_card)) == []
    assert hub_card.data.base_model == "Qwen/Qwen2-0.5B" and local_card.data.base_model is None
    assert f"Base model: `{tmp_path}`" in local_card.text
    assert set(hub_card.data.tags) == {"trl", "grpo", "grpo-hub", "lora", "cispo"}
    assert "| `reward` | 0.6 |" in hub_card.text and "| `train_loss` | 0.25 |" in hub_card.text
    assert "at training step 2" in hub_card.text and "grpo-hub pull alice/x@step-2" in hub_card.text


def test_training_config_keeps_what_matters_and_never_a_token(tmp_path):
    from grpo_hub.training.config import GRPOHubConfig

    args = GRPOHubConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, loss_type="gspo", hub_token="hf_secret"
    )
    config = training_config(args, {"r": 8, "lora_alpha": 16, "target_modules": ["v_proj", "q_proj"]})
    assert loss_variant(config) == "gspo"
    assert config["lora_r"] == 8 and config["target_modules"] == "q_proj, v_proj"
    assert "filter_zero_signal" in config  # a grpo_hub config field rides along
    assert not any("token" in key for key in config) and "hf_secret" not in str(config)


def test_reward_curve_is_a_png_only_when_rewards_were_logged():
    from PIL import Image

    assert reward_curve_png([{"loss": 1.0, "step": 1}]) is None
    image = Image.open(io.BytesIO(reward_curve_png(LOG)))
    assert image.format == "PNG" and image.size == (600, 350)
