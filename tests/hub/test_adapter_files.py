"""Selecting the trained adapter: never the "ref" adapter (subfolder or inside the weights), nor trainer state."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load, save_file

from grpo_hub.hub.adapter_files import adapter_names_in, trained_adapter_files

pytestmark = pytest.mark.hub
PREFIX = "base_model.model.model.layers.0.self_attn.q_proj"


def _checkpoint(folder, weights: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "/models/tiny", "r": 2})
    )
    save_file(weights, str(folder / "adapter_model.safetensors"))
    for junk in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin"):
        (folder / junk).write_bytes(b"not for the Hub")
    (folder / "tokenizer.json").write_text("{}")


def test_saved_adapter_is_pushed_as_is_and_ref_folder_and_state_are_left_out(tmp_path):
    weights = {f"{PREFIX}.lora_A.weight": torch.ones(2, 4), f"{PREFIX}.lora_B.weight": torch.zeros(4, 2)}
    _checkpoint(tmp_path, weights)
    _checkpoint(tmp_path / "ref", {f"{PREFIX}.lora_A.weight": torch.full((2, 4), 7.0)})
    files = trained_adapter_files(tmp_path)
    assert set(files) == {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"}
    assert files["adapter_model.safetensors"] == tmp_path / "adapter_model.safetensors"


def test_weights_holding_several_adapters_keep_only_the_trained_one_in_peft_form(tmp_path):
    weights = {
        f"{PREFIX}.lora_A.default.weight": torch.ones(2, 4),
        f"{PREFIX}.lora_B.default.weight": torch.full((4, 2), 2.0),
        f"{PREFIX}.lora_A.ref.weight": torch.full((2, 4), 7.0),
        f"{PREFIX}.lora_B.ref.weight": torch.full((4, 2), 7.0),
        "base_model.model.lm_head.modules_to_save.default.weight": torch.full((3, 4), 3.0),
    }
    _checkpoint(tmp_path, weights)
    assert adapter_names_in(weights) == {"default", "ref"}
    files = trained_adapter_files(tmp_path, base_model="org/tiny")
    selected = load(files["adapter_model.safetensors"])
    assert sorted(selected) == sorted(
        [f"{PREFIX}.lora_A.weight", f"{PREFIX}.lora_B.weight", "base_model.model.lm_head.weight"]
    )
    assert torch.equal(selected[f"{PREFIX}.lora_B.weight"], torch.full((4, 2), 2.0))
    assert json.loads(files["adapter_config.json"])["base_model_name_or_path"] == "org/tiny"


def test_named_adapter_comes_from_its_subfolder_and_a_missing_name_is_explained(tmp_path):
    _checkpoint(tmp_path / "policy", {f"{PREFIX}.lora_A.weight": torch.ones(2, 4)})
    assert trained_adapter_files(tmp_path, adapter_name="policy")["adapter_model.safetensors"] == (
        tmp_path / "policy" / "adapter_model.safetensors"
    )
    _checkpoint(tmp_path / "mixed", {f"{PREFIX}.lora_A.ref.weight": torch.ones(2, 4)})
    (tmp_path / "mixed" / "extra").mkdir()
    with pytest.raises(ValueError, match=r"holds the adapters \['ref'\] but none named 'default'"):
        trained_adapter_files(tmp_path / "mixed")
