"""GRPOHubTrainer wiring of the reference adapter: config errors, peft_config path, save_model, checkpoints."""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, TrainerCallback

from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.tasks.tiny_model import build_tiny_model
from grpo_hub.training.reference import (
    REF_ADAPTER,
    REF_ADAPTER_FILE,
    ReferenceAdapterCallback,
    attach_reference_adapter,
)

from .helpers import (
    adapter_tensors,
    char_code_reward,
    grpo_args,
    lora_config,
    prompt_dataset,
    tiny_peft_model,
    tiny_tokenizer,
)


def _config(output_dir, **overrides) -> GRPOHubConfig:
    return grpo_args(output_dir, GRPOHubConfig, **{"max_steps": 3, **overrides})


def _trainer(config, model=None, peft_config=None) -> GRPOHubTrainer:
    return GRPOHubTrainer(
        model=model if model is not None else AutoModelForCausalLM.from_pretrained(build_tiny_model()),
        reward_funcs=char_code_reward,
        args=config,
        train_dataset=prompt_dataset(),
        processing_class=tiny_tokenizer(),
        peft_config=peft_config,
    )


def _callbacks(trainer) -> list[ReferenceAdapterCallback]:
    return [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ReferenceAdapterCallback)]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(ref_adapter_sync_on="steps", beta=0.0), "beta"),
        (dict(ref_adapter_keep=True, beta=0.0), "beta"),
        (dict(ref_adapter_sync_on="always"), "ref_adapter_sync_on"),
        (dict(ref_adapter_sync_on="steps", ref_adapter_sync_steps=0), "ref_adapter_sync_steps"),
        (dict(ref_adapter_mixup_alpha=0.0), "ref_adapter_mixup_alpha"),
        (dict(ref_adapter_mixup_alpha=1.01), "ref_adapter_mixup_alpha"),
        (dict(ref_adapter_sync_on="epoch", sync_ref_model=True), "sync_ref_model"),
    ],
)
def test_config_rejects_bad_reference_settings(tmp_path, overrides, field):
    with pytest.raises(ValueError, match=field):
        _config(tmp_path, **overrides)


def test_refresh_without_peft_points_to_sync_ref_model(tmp_path):
    with pytest.raises(ValueError, match="sync_ref_model"):
        _trainer(_config(tmp_path, ref_adapter_sync_on="steps"))


def test_defaults_with_peft_config_add_no_reference_adapter(tmp_path):
    trainer = _trainer(_config(tmp_path), peft_config=lora_config())
    assert REF_ADAPTER not in trainer.model.peft_config  # TRL's behaviour: base model with adapters disabled
    assert _callbacks(trainer) == []


def test_keep_with_peft_config_adds_frozen_inactive_copy(tmp_path):
    trainer = _trainer(_config(tmp_path, ref_adapter_keep=True), peft_config=lora_config())
    model = trainer.model
    assert REF_ADAPTER in model.peft_config and model.active_adapter == "default"
    ref = adapter_tensors(model, REF_ADAPTER)
    assert ref and all(torch.equal(t, adapter_tensors(model, "default")[n]) for n, t in ref.items())
    assert not any(p.requires_grad for n, p in model.named_parameters() if f".{REF_ADAPTER}." in n)
    assert [cb.sync_on for cb in _callbacks(trainer)] == ["never"]


def test_trl_made_reference_is_checkpointed_by_default(tmp_path):
    trainer = _trainer(_config(tmp_path, save_strategy="steps", save_steps=3), model=tiny_peft_model())
    assert [cb.sync_on for cb in _callbacks(trainer)] == ["never"]
    trainer.train()
    checkpoint = tmp_path / "checkpoint-3"
    assert (checkpoint / REF_ADAPTER_FILE).is_file() and not (checkpoint / REF_ADAPTER).exists()


def test_peft_config_refresh_trains_against_fresh_reference(tmp_path):
    config = _config(tmp_path, max_steps=4, ref_adapter_sync_on="steps", ref_adapter_sync_steps=2)
    trainer = _trainer(config, peft_config=lora_config())
    trainer.train()
    assert _callbacks(trainer)[0].refreshed_at == [2, 4]
    kl = {row["step"]: row["kl"] for row in trainer.state.log_history if "kl" in row}
    assert kl[2] > 1e-4 and kl[3] < 1e-7  # step 3 starts right after the step-2 hard refresh
    trained, ref = adapter_tensors(trainer.model, "default"), adapter_tensors(trainer.model, REF_ADAPTER)
    assert all(torch.equal(ref[n], trained[n]) for n in ref)


@pytest.mark.parametrize("save_ref", [False, True])
def test_save_model_holds_only_trained_adapter_unless_asked(tmp_path, save_ref):
    trainer = _trainer(
        _config(tmp_path, ref_adapter_keep=True, ref_adapter_save=save_ref), peft_config=lora_config()
    )
    trainer.save_model(str(tmp_path / "final"))
    assert (tmp_path / "final" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "final" / REF_ADAPTER / "adapter_model.safetensors").is_file() == save_ref


def test_fsdp_is_refused_with_a_fix(tmp_path):
    fsdp_trainer = SimpleNamespace(
        args=_config(tmp_path, ref_adapter_sync_on="steps"), model=tiny_peft_model(), is_fsdp_enabled=True
    )
    with pytest.raises(ValueError, match="not FSDP"):
        attach_reference_adapter(fsdp_trainer)
    assert REF_ADAPTER not in fsdp_trainer.model.peft_config


class _RefAtStepBegin(TrainerCallback):
    """Records the "ref" adapter tensors at the beginning of every optimizer step."""

    def __init__(self):
        self.ref = {}

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.ref[state.global_step] = adapter_tensors(model, REF_ADAPTER)


def test_resume_path_given_to_train_restores_the_reference(tmp_path):
    """`trainer.train(resume_from_checkpoint=<folder outside output_dir>)` restores the saved reference."""
    settings = dict(max_steps=4, ref_adapter_sync_on="steps", ref_adapter_sync_steps=2, save_strategy="steps")
    straight = _trainer(_config(tmp_path / "a", save_steps=2, **settings), peft_config=lora_config())
    straight_probe = _RefAtStepBegin()
    straight.add_callback(straight_probe)
    straight.train()

    resumed = _trainer(_config(tmp_path / "b", save_steps=100, **settings), peft_config=lora_config())
    resumed_probe = _RefAtStepBegin()
    resumed.add_callback(resumed_probe)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))

    before, after = straight_probe.ref[0], straight_probe.ref[2]
    assert any(not torch.equal(before[n], after[n]) for n in after)  # the step-2 refresh moved it
    assert all(torch.equal(resumed_probe.ref[2][n], t) for n, t in after.items())
