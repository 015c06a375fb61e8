"""The chain model: shipped weights match their recipe, the build reproduces them, cached builds by fingerprint."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_hub.tasks import chain, chain_model
from grpo_hub.tasks.chain_model import SHIPPED_DIR, build_chain_model, chain_model_path

SHORT_SFT = {"steps": 3, "batch_size": 8}


def test_shipped_weights_record_the_current_recipe_and_are_the_default():
    assert json.loads((SHIPPED_DIR / chain_model.RECIPE_FILE).read_text()) == chain_model.build_recipe()
    assert chain_model.shipped_is_current() and chain_model_path() == str(SHIPPED_DIR)


def test_a_changed_recipe_falls_back_to_a_cached_build(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_HUB_CACHE", str(tmp_path))
    monkeypatch.setitem(chain_model.SFT_RECIPE, "steps", 2)
    monkeypatch.setitem(chain_model.SFT_RECIPE, "batch_size", 4)
    assert not chain_model.shipped_is_current()
    folder = Path(chain_model_path())
    assert folder.parent == tmp_path and folder.name.startswith("chain-qwen2-seed0-")
    assert json.loads((folder / chain_model.RECIPE_FILE).read_text())["sft"]["steps"] == 2


def test_short_builds_are_deterministic_and_keyed_by_recipe(tmp_path):
    first = build_chain_model(tmp_path / "a", sft=SHORT_SFT)
    again = build_chain_model(tmp_path / "b", sft=SHORT_SFT)
    longer = build_chain_model(tmp_path / "c", sft={**SHORT_SFT, "steps": 4})
    weights = Path(first, "model.safetensors").read_bytes()
    assert Path(again, "model.safetensors").read_bytes() == weights
    assert Path(longer, "model.safetensors").read_bytes() != weights
    with pytest.raises(ValueError, match="unknown sft"):
        build_chain_model(tmp_path / "x", sft={"epochs": 3})


def test_shipped_model_is_partly_right_with_room_to_learn():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR)
    report = chain.evaluate(model, AutoTokenizer.from_pretrained(SHIPPED_DIR), n=100)["greedy"]
    assert 0.15 <= report["all"] <= 0.5
    assert report["1"] > report["4"]  # errors compound along the chain


@pytest.mark.slow
def test_the_build_reproduces_the_shipped_weights(background_rebuild):
    """The full build (`python -m grpo_hub.tasks.chain_model`, ~8 min on one core; started in the background at the
    end of collection, tests/tasks/conftest.py) gives the shipped tensors: bit for bit on the CPU kind that built them
    (measured), else (another CPU's matmul kernels round differently over 1,100 steps) the same held-out accuracy
    within 10 points. At step 1,100 SFT accuracy climbs ~7-13 points per 100 steps (docs/tasks.md: 0.16 at 1,000,
    0.30 at 1,100, 0.37 at 1,200), so rounding drift moves it by points: the previous 4-layer 700-step model, rebuilt on
    an AMD EPYC VM (2026-11-24), scored 0.2215 against its shipped 0.2685."""
    rebuilt = background_rebuild
    shipped, fresh = load_file(SHIPPED_DIR / "model.safetensors"), load_file(rebuilt / "model.safetensors")
    assert shipped.keys() == fresh.keys()
    if all(torch.equal(shipped[k], fresh[k]) for k in shipped):
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_DIR)
    accuracy = [
        chain.evaluate(AutoModelForCausalLM.from_pretrained(folder), tokenizer)["greedy"]["all"]
        for folder in (SHIPPED_DIR, rebuilt)
    ]
    assert abs(accuracy[0] - accuracy[1]) <= 0.10, accuracy
