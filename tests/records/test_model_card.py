"""Model card and run record: metadata that validates, the non-default config (no tokens), metrics, curve,
variant, base-model note, usage, versions, citations; records read back from every kind of saved folder."""

from __future__ import annotations

import io
import json

from grpo_hub.records.model_card import (
    build_model_card,
    final_metrics,
    pushed_revision,
    reward_curve_png,
    write_card_files,
)
from grpo_hub.records.run_record import changed_fields, loss_variant, read_run_record, run_record
from tests.hub.fake_hub import validate_card_yaml

LOG = [
    {"reward": 0.1, "reward_std": 0.05, "rewards/a/mean": 0.1, "rewards/b/mean": 0.0, "loss": 0.3, "step": 1},
    {"reward": 0.6, "reward_std": 0.10, "rewards/a/mean": 0.5, "rewards/b/mean": 0.1, "loss": 0.2, "step": 2},
    {"train_runtime": 1.5, "train_loss": 0.25, "step": 2},
]


def _card(base_model, variant="cispo"):
    record = {"loss_variant": variant, "step": 2, "config": {"beta": 0.04}, "log_history": LOG}
    return build_model_card(
        record, repo_id="alice/x", revision="step-2", base_model=base_model, has_curve=True
    )


def test_card_metadata_validates_and_only_names_hub_base_models(tmp_path):
    hub_card, local_card = _card("Qwen/Qwen2-0.5B"), _card(str(tmp_path))
    assert validate_card_yaml(str(hub_card)) == [] and validate_card_yaml(str(local_card)) == []
    assert hub_card.data.base_model == "Qwen/Qwen2-0.5B" and local_card.data.base_model is None
    assert f"Base model: `{tmp_path}`" in local_card.text and "--base-model OWNER/BASE" in local_card.text
    assert "--base-model" not in hub_card.text
    assert set(hub_card.data.tags) == {"trl", "grpo", "grpo-hub", "lora", "cispo"}
    assert "| `reward` | 0.6 |" in hub_card.text and "| `train_loss` | 0.25 |" in hub_card.text
    assert (
        "| `beta` | 0.04 |" in hub_card.text and "loss variant **`cispo`**, 2 training steps" in hub_card.text
    )
    assert 'AutoPeftModelForCausalLM.from_pretrained("alice/x", revision="step-2")' in hub_card.text
    assert "grpo-hub pull alice/x@step-2" in hub_card.text and "- TRL: " in hub_card.text
    assert "arXiv:2402.03300" in hub_card.text and "arXiv:2506.13585" in hub_card.text  # GRPO + CISPO
    assert (
        pushed_revision(str(hub_card)) == "step-2"
    )  # the branch the card was pushed to (hub/pull.py checks it)


def test_run_record_keeps_non_default_fields_the_variant_and_never_a_token(tmp_path):
    from grpo_hub.config.hub_config import GRPOHubConfig

    args = GRPOHubConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        loss_type="gspo",
        filter_zero_signal=True,
        hub_token="hf_secret",
    )
    record = run_record(args, LOG, 2, "Qwen/Qwen2-0.5B")
    assert record["loss_variant"] == "gspo" == loss_variant(vars(args))
    assert (
        record["config"]["importance_sampling_level"] == "sequence"
        and record["config"]["filter_zero_signal"] is True
    )
    assert (
        "learning_rate" not in record["config"] and "output_dir" not in record["config"]
    )  # defaults, bookkeeping
    assert "hf_secret" not in json.dumps(record) and "hf_secret" not in json.dumps(changed_fields(args))
    assert [e["step"] for e in record["log_history"]] == [1, 2, 2]


def test_read_run_record_falls_back_to_trainer_state_then_run_summary(tmp_path):
    (tmp_path / "run_summary.json").write_text(json.dumps({"steps": 3, "rewards": [0.1, 0.5, 0.9]}))
    record = read_run_record(tmp_path)
    assert record["step"] == 3 and [e["reward"] for e in record["log_history"]] == [0.1, 0.5, 0.9]
    assert final_metrics(record["log_history"]) == {"reward": 0.9}
    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 3, "log_history": LOG}))
    assert read_run_record(tmp_path)["log_history"][1]["reward"] == 0.6


def test_reward_curve_is_a_png_only_when_rewards_were_logged():
    from PIL import Image

    assert reward_curve_png([{"loss": 1.0, "step": 1}]) is None
    image = Image.open(io.BytesIO(reward_curve_png(LOG)))
    assert image.format == "PNG" and image.size == (600, 350)


def test_without_matplotlib_the_card_is_written_without_a_curve_and_a_warning(tmp_path, monkeypatch, caplog):
    """A run in an environment lacking matplotlib (a --no-deps install) still saves once training is done."""
    for module in ("matplotlib", "matplotlib.backends.backend_agg", "matplotlib.figure"):
        monkeypatch.setitem(__import__("sys").modules, module, None)  # `import` of it raises ImportError
    write_card_files(tmp_path, {"loss_variant": "grpo", "step": 2, "config": {}, "log_history": LOG})
    assert not (tmp_path / "reward_curve.png").exists()
    assert "Not drawn: matplotlib was not installed" in (tmp_path / "README.md").read_text()
    assert (tmp_path / "grpo_run.json").is_file()
    (warning,) = [r.getMessage() for r in caplog.records if "reward curve" in r.getMessage()]
    assert "matplotlib" in warning and "Fix: install grpo-hub with its dependencies" in warning


def test_run_record_leaves_a_live_deepspeed_run_alone(tmp_path, monkeypatch):
    """Building the reference config must not install another DeepSpeed config (ZeRO-3 ranks would desync)."""
    from transformers.integrations import deepspeed

    from grpo_hub.config.hub_config import GRPOHubConfig

    args = GRPOHubConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, learning_rate=0.5)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    before = deepspeed._hf_deepspeed_config_weak_ref
    assert changed_fields(args)["learning_rate"] == 0.5
    assert deepspeed._hf_deepspeed_config_weak_ref is before
    assert __import__("os").environ["ACCELERATE_USE_DEEPSPEED"] == "true"
