"""Cached offline model builds on a machine with several ranks: built once while the others wait, complete folders
only, the cache's own leftovers rebuilt, a user's folder never touched (issue 48, item 1)."""

from pathlib import Path

import pytest

import grpo_hub.tasks.tiny_model as tiny_model
from grpo_hub.tasks import build_tiny_model
from tests.tasks.cache_ranks import build_on_two_ranks

MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def assert_complete(folder) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = sorted(path.name for path in Path(folder).iterdir())
    assert set(MODEL_FILES) <= set(names), names
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    assert model.config.vocab_size == len(tokenizer)


def write_tokenizer_only(folder, seed) -> None:
    """What a rank other than 0 wrote before: transformers skipped the weights and config there."""
    tiny_model.train_tokenizer(seed).save_pretrained(folder)


@pytest.mark.distributed
@pytest.mark.parametrize("first", [0, 1], ids=["rank0-first", "rank1-first"])
def test_two_ranks_on_a_cold_cache_build_once_then_reuse_the_folder(tmp_path, first):
    cache = tmp_path / "cache"
    built, folders = build_on_two_ranks(cache, tmp_path / "cold", "tiny", first)
    assert built == [first], f"ranks that built: {built}"
    assert folders[0] == folders[1] and Path(folders[0]).parent == cache
    assert_complete(folders[0])
    alone = build_tiny_model(tmp_path / "one-process")  # the same bytes whichever rank built them
    for name in MODEL_FILES:
        assert Path(folders[0], name).read_bytes() == Path(alone, name).read_bytes(), name
    assert [p.name for p in cache.iterdir()] == [Path(folders[0]).name]  # no staging folder or lock left

    stamp = Path(folders[0], "model.safetensors").stat().st_mtime_ns
    built, again = build_on_two_ranks(cache, tmp_path / "warm", "tiny", None)
    assert built == [] and again == folders
    assert Path(folders[0], "model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.distributed
@pytest.mark.parametrize("builder", ["chain", "arithmetic"])
def test_every_cached_build_is_complete_when_rank_1_builds_it(tmp_path, builder):
    built, folders = build_on_two_ranks(tmp_path / "cache", tmp_path / "run", builder, first=1)
    assert built == [1] and folders[0] == folders[1]
    assert_complete(folders[0])


def test_a_cache_folder_left_incomplete_is_rebuilt_but_an_output_dir_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_HUB_CACHE", str(tmp_path / "cache"))
    poisoned = tmp_path / "cache" / f"tiny-qwen2-seed0-{tiny_model.build_fingerprint(0)}"
    user_dir = tmp_path / "mine"
    for folder in (poisoned, user_dir):
        folder.mkdir(parents=True)
        write_tokenizer_only(folder, 0)
    assert build_tiny_model() == str(poisoned)
    assert_complete(poisoned)
    with pytest.raises(FileExistsError, match=r"holds no complete model; pass an empty or new `output_dir`"):
        build_tiny_model(user_dir)
    assert not (user_dir / "model.safetensors").exists()


def test_a_staging_folder_without_weights_is_never_renamed_into_place(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny_model, "_write_model", write_tokenizer_only)
    with pytest.raises(
        RuntimeError, match="build_tiny_model: the build wrote no config.json, model.safetensors;"
    ):
        build_tiny_model()
    assert list(tmp_path.iterdir()) == []  # nothing cached, no staging folder or lock left
