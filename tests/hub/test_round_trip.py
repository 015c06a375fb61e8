"""Train -> push every checkpoint (branch step-N) and the final adapter (main) -> pull each revision back."""

from __future__ import annotations

import io

import pytest
import torch
from safetensors.torch import load, load_file

from tests.hub.conftest import ALICE, RUN_BASE_MODEL_ID, RUN_REPO

pytestmark = pytest.mark.hub

EXPECTED_FILES = {
    ".gitattributes",
    "README.md",
    "adapter_config.json",
    "adapter_model.safetensors",
    "reward_curve.png",
    "grpo_run.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
}


def _local_weights(run, revision: str) -> dict:
    folder = run["out"] if revision == "main" else run["out"] / f"checkpoint-{revision.split('-')[1]}"
    return load_file(str(folder / "adapter_model.safetensors"))


def _assert_same_tensors(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(actual[key].cpu(), value.cpu()), key


def test_callback_pushes_each_checkpoint_to_its_branch_and_the_final_adapter_to_main(trained_run, hub):
    pushed = trained_run["callback"].pushed
    assert [p.revision for p in pushed] == ["step-2", "step-4", "main"]
    repo = hub.repos[RUN_REPO]
    for push in pushed:
        assert repo.branches[push.revision] == push.commit_sha  # one commit per push, branch points at it
        files = hub.files(RUN_REPO, push.revision)
        assert set(files) == EXPECTED_FILES, (
            f"{push.revision}: unexpected files {set(files) ^ EXPECTED_FILES}"
        )
        _assert_same_tensors(
            load(files["adapter_model.safetensors"]), _local_weights(trained_run, push.revision)
        )
        assert all(ALICE.encode() not in content for content in files.values()), "a token was pushed"
    step2, step4 = (load(hub.files(RUN_REPO, f"step-{n}")["adapter_model.safetensors"]) for n in (2, 4))
    assert any(not torch.equal(step2[k], step4[k]) for k in step2), (
        "checkpoints 2 and 4 hold the same weights"
    )
    assert any(k.endswith("lora_B.weight") and step4[k].abs().sum() > 0 for k in step4), (
        "LoRA B never trained"
    )


def test_pull_each_revision_returns_the_local_checkpoint_weights_pinned_to_its_commit(
    trained_run, hub, tiny_model_dir
):
    from peft import get_peft_model_state_dict

    from grpo_hub.hub import pull_adapter

    for push in trained_run["callback"].pushed:
        model, info = pull_adapter(f"{RUN_REPO}@{push.revision}", base_model=tiny_model_dir, token=ALICE)
        assert info.commit_sha == push.commit_sha and info.revision == push.revision
        assert info.base_model == tiny_model_dir
        assert set(model.peft_config) == {"default"}
        _assert_same_tensors(
            get_peft_model_state_dict(model, save_embedding_layers=False),
            _local_weights(trained_run, push.revision),
        )


def test_pull_by_tag_and_by_commit_sha_resolve_to_the_same_pinned_commit(trained_run, hub, tiny_model_dir):
    from huggingface_hub import HfApi

    from grpo_hub.hub import download_adapter

    step2 = trained_run["callback"].pushed[0]
    HfApi(token=ALICE).create_tag(RUN_REPO, tag="v-step2", revision="step-2", exist_ok=True)
    by_tag = download_adapter(f"{RUN_REPO}@v-step2", token=ALICE)
    by_sha = download_adapter(f"{RUN_REPO}@{step2.commit_sha}", token=ALICE)
    assert by_tag.commit_sha == by_sha.commit_sha == step2.commit_sha
    assert by_tag.base_model == RUN_BASE_MODEL_ID  # the pushed adapter config names the Hub base model
    weights = load_file(f"{by_tag.adapter_dir}/adapter_model.safetensors")
    _assert_same_tensors(weights, _local_weights(trained_run, "step-2"))


def test_model_card_has_metadata_config_metrics_and_reward_curve(trained_run, hub):
    from huggingface_hub import ModelCard
    from PIL import Image

    files = hub.files(RUN_REPO, "main")
    card = ModelCard(files["README.md"].decode())
    assert card.data.base_model == RUN_BASE_MODEL_ID
    assert card.data.library_name == "peft"
    assert {"trl", "grpo", "grpo-hub", "dapo"} <= set(card.data.tags)  # dapo: TRL 1.16's default loss_type
    final = next(e for e in reversed(trained_run["trainer"].state.log_history) if "reward" in e)
    assert f"| `reward` | {final['reward']:.4g} |" in card.text
    assert "| `beta` | 0.04 |" in card.text and "| `lora_r` | 4 |" in card.text
    assert "hub_token" not in card.text and "loss variant **`dapo`**" in card.text
    assert "![Mean reward per logged step](reward_curve.png)" in card.text
    assert ("POST", "validate_yaml") in hub.requests  # the front matter went through the Hub's validation
    image = Image.open(io.BytesIO(files["reward_curve.png"]))
    assert image.format == "PNG" and image.size == (600, 350)
    assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or range(2)) > 2, "blank reward curve"


def test_pull_merge_writes_a_merged_model_folder_with_the_same_outputs(
    trained_run, hub, tiny_model_dir, tmp_path
):
    from transformers import AutoModelForCausalLM

    from grpo_hub.hub import pull_adapter

    spec = f"{RUN_REPO}@step-4"
    peft_model, _ = pull_adapter(spec, base_model=tiny_model_dir, token=ALICE)
    merged, info = pull_adapter(
        spec, base_model=tiny_model_dir, merge=True, output_dir=tmp_path / "merged", token=ALICE
    )
    assert info.output_dir == str(tmp_path / "merged")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf_home", "merged"]  # no staging folder left
    names = {p.name for p in (tmp_path / "merged").iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    } <= names and "adapter_config.json" not in names
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
        # Merging folds B@A into W: float32 rounding differs from x@W + x@A@B by ~1e-6 of the logits'
        # magnitude (~10 for this model), so compare at 1e-4 — far below the adapter's own effect, checked last.
        torch.testing.assert_close(reloaded(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)
        assert (
            base(input_ids=ids).logits - expected
        ).abs().max() > 1e-2  # the merge really applied the adapter


def test_card_usage_snippets_load_the_pushed_adapter_from_the_hub(
    trained_run, hub, tiny_model_dir, monkeypatch
):
    """Run the card's Python blocks as pasted (base model and adapter both downloaded from the Hub)."""
    import re

    from huggingface_hub import HfApi, ModelCard

    api = HfApi(token=ALICE)
    api.create_repo(RUN_BASE_MODEL_ID, exist_ok=True)
    api.upload_folder(repo_id=RUN_BASE_MODEL_ID, folder_path=tiny_model_dir)
    monkeypatch.setenv("HF_TOKEN", ALICE)
    card = ModelCard(hub.files(RUN_REPO, "step-2")["README.md"].decode())
    snippets = re.findall(r"```python\n(.*?)```", card.text, flags=re.S)
    assert len(snippets) == 2 and 'revision="step-2"' in snippets[0]
    namespace: dict = {}
    exec(snippets[0], namespace)  # AutoPeftModelForCausalLM + generate + decode
    weights = {k: v for k, v in namespace["model"].state_dict().items() if "lora_B" in k}
    assert weights and any(
        t.abs().sum() > 0 for t in weights.values()
    )  # the trained adapter, not a fresh one
    exec(snippets[1], namespace)  # the pipeline on that model
