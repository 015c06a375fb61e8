"""The offline arithmetic model: deterministic cached build, char-level tokenizer, evaluation per level."""

from pathlib import Path

import pytest

from grpo_hub.tasks import build_arithmetic_model
from grpo_hub.tasks.arithmetic import LEVELS, chat_prompt, chat_text, evaluate

SHORT_SFT = {"steps": 3, "batch_size": 8}  # a few steps: determinism does not need a useful model


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    return build_arithmetic_model(tmp_path_factory.mktemp("arith") / "model", sft=SHORT_SFT)


def test_same_recipe_same_weights_and_the_cache_is_reused(tmp_path, short_model):
    again = build_arithmetic_model(tmp_path / "again", sft=SHORT_SFT)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert Path(again, name).read_bytes() == Path(short_model, name).read_bytes()
    before = Path(again, "model.safetensors").stat().st_mtime_ns
    assert build_arithmetic_model(again, sft=SHORT_SFT) == again
    assert Path(again, "model.safetensors").stat().st_mtime_ns == before


def test_seed_and_budget_change_the_weights_and_the_cache_folder(tmp_path, short_model, monkeypatch):
    weights = Path(short_model, "model.safetensors").read_bytes()
    other_seed = build_arithmetic_model(tmp_path / "seed1", seed=1, sft=SHORT_SFT)
    longer = build_arithmetic_model(tmp_path / "longer", sft={**SHORT_SFT, "steps": 4})
    assert Path(other_seed, "model.safetensors").read_bytes() != weights
    assert Path(longer, "model.safetensors").read_bytes() != weights
    monkeypatch.setenv("GRPO_HUB_CACHE", str(tmp_path / "cache"))
    folders = {Path(build_arithmetic_model(sft=s)).name for s in (SHORT_SFT, {**SHORT_SFT, "steps": 4})}
    assert len(folders) == 2 and all(name.startswith("arithmetic-qwen2-seed0-") for name in folders)


def test_unknown_sft_setting_and_bad_seed_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown sft"):
        build_arithmetic_model(tmp_path / "x", sft={"epochs": 3})
    with pytest.raises(ValueError, match="seed"):
        build_arithmetic_model(tmp_path / "x", seed=-1)


def test_tokenizer_keeps_every_digit_a_token_and_round_trips(short_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(short_model)
    for text in ["1234+5678=", "-9087", "12 apples, -3 pears!"]:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
    assert len(tokenizer("9876543210")["input_ids"]) == 10
    chat = tokenizer.apply_chat_template(chat_prompt("12+3="), tokenize=False, add_generation_prompt=True)
    assert chat == chat_text("12+3=") == "<|im_start|>u12+3=<|im_end|><|im_start|>a"


def test_evaluate_reports_every_level(short_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(short_model)
    tokenizer = AutoTokenizer.from_pretrained(short_model)
    report = evaluate(model, tokenizer, "heldout", n=2, pass_k=2)
    assert set(report) == {"greedy", "pass@2", "sampled"}
    for levels in report.values():
        assert set(levels) == {str(level) for level in LEVELS} | {"all"}
        assert all(0.0 <= value <= 1.0 for value in levels.values())
    assert report["greedy"] == evaluate(model, tokenizer, "heldout", n=2)["greedy"]  # greedy is deterministic
