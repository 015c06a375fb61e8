"""Reference adapter without training: pairing, creation, copy/EMA maths, PEFT variants, save/load, errors."""

import os

import pytest
import torch
from peft import (
    AdaLoraConfig,
    FourierFTConfig,
    IA3Config,
    LoHaConfig,
    LoKrConfig,
    LoraConfig,
    OFTConfig,
    VeraConfig,
    get_peft_model,
)
from transformers import AutoModelForCausalLM

from grpo_hub.tasks.tiny_model import build_tiny_model
from grpo_hub.training.reference import (
    REF_ADAPTER,
    REF_ADAPTER_FILE,
    ReferenceAdapterCallback,
    add_reference_adapter,
    check_supported_peft,
    load_reference_adapter,
    mix_,
    paired_parameters,
    refresh_reference_adapter,
    save_reference_adapter,
    should_refresh_at_step,
    strip_reference_adapter,
    swap_adapter_name,
    validate_reference_settings,
)

from .helpers import adapter_tensors, tiny_peft_model

TARGETS = ["q_proj", "v_proj"]
MIXABLE_CONFIGS = {
    "lora": lambda: LoraConfig(target_modules=TARGETS, r=4, init_lora_weights=False),
    "dora": lambda: LoraConfig(target_modules=TARGETS, r=4, use_dora=True, init_lora_weights=False),
    "lora+modules_to_save": lambda: LoraConfig(
        target_modules=TARGETS, r=4, modules_to_save=["lm_head"], init_lora_weights=False
    ),
    "loha": lambda: LoHaConfig(target_modules=TARGETS, r=4, init_weights=False),
    "lokr": lambda: LoKrConfig(target_modules=TARGETS, r=4, init_weights=False),
    "ia3": lambda: IA3Config(target_modules=TARGETS, feedforward_modules=[], init_ia3_weights=False),
    "vera": lambda: VeraConfig(target_modules=TARGETS, r=4, init_weights=False),
    "oft": lambda: OFTConfig(target_modules=TARGETS, r=0, oft_block_size=8, init_weights=False),
    "fourierft": lambda: FourierFTConfig(target_modules=TARGETS, n_frequency=16, init_weights=False),
}


def _base_model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(build_tiny_model())


def _perturb_trained(model, scale: float = 0.05) -> None:
    """Move the trained adapter away from the reference (as training would)."""
    with torch.no_grad():
        for _, trained, _ in paired_parameters(model, "default"):
            trained.add_(scale * torch.randn_like(trained))


def _logits(model, adapter: str) -> torch.Tensor:
    tokens = torch.arange(3, 19).reshape(2, 8)
    previous = model.active_adapter
    model.set_adapter(adapter)
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    model.set_adapter(previous)
    return logits


def test_swap_adapter_name_replaces_whole_components_only():
    assert (
        swap_adapter_name("m.q_proj.lora_A.default.weight", "default", "ref") == "m.q_proj.lora_A.ref.weight"
    )
    assert swap_adapter_name("m.q_proj.hada_w1_a.default", "default", "ref") == "m.q_proj.hada_w1_a.ref"
    assert swap_adapter_name("m.default_proj.weight", "default", "ref") is None


def test_should_refresh_at_step_follows_schedule():
    assert [s for s in range(10) if should_refresh_at_step("steps", 3, s)] == [3, 6, 9]
    assert not any(should_refresh_at_step("epoch", 1, s) for s in range(5))
    assert not any(should_refresh_at_step("never", 1, s) for s in range(5))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(sync_on="step"), "ref_adapter_sync_on"),
        (dict(sync_steps=0), "ref_adapter_sync_steps"),
        (dict(sync_steps=2.5), "ref_adapter_sync_steps"),
        (dict(mixup_alpha=0.0), "ref_adapter_mixup_alpha"),
        (dict(mixup_alpha=1.5), "ref_adapter_mixup_alpha"),
        (dict(beta=0.0), "beta"),
        (dict(sync_on="never", keep=True, beta=0.0), "beta"),
        (dict(sync_ref_model=True), "sync_ref_model"),
    ],
)
def test_validate_reference_settings_names_the_field(kwargs, field):
    settings = dict(
        sync_on="steps", sync_steps=4, mixup_alpha=1.0, beta=0.1, sync_ref_model=False, keep=False
    )
    settings.update(kwargs)
    with pytest.raises(ValueError, match=field):
        validate_reference_settings(**settings)


def test_valid_settings_pass():
    validate_reference_settings("epoch", 1, 0.5, 0.04, False, True)
    validate_reference_settings("never", 64, 1.0, 0.0, True, False)


def test_add_reference_adapter_is_frozen_inactive_and_equal():
    model = get_peft_model(_base_model(), MIXABLE_CONFIGS["lora"]())
    trainable_before = {n for n, p in model.named_parameters() if p.requires_grad}
    assert add_reference_adapter(model) is True
    assert model.active_adapter == "default"
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable_before
    ref = adapter_tensors(model, REF_ADAPTER)
    trained = adapter_tensors(model, "default")
    assert ref.keys() == trained.keys() and len(ref) == 8
    for name in ref:
        assert torch.equal(ref[name], trained[name])
    assert torch.equal(_logits(model, "default"), _logits(model, REF_ADAPTER))
    assert add_reference_adapter(model) is False  # idempotent: an existing "ref" is kept


@pytest.mark.parametrize("autocast", [False, True])
def test_reference_takes_the_trained_adapter_dtype_of_a_bf16_model(autocast):
    """TRL keeps a bf16 model's LoRA in bf16 under ZeRO-3 (autocast_adapter_dtype=False) while PEFT's
    add_adapter upcasts a new adapter to fp32: the reference must follow the trained adapter either way."""
    model = get_peft_model(
        _base_model().to(torch.bfloat16), MIXABLE_CONFIGS["lora"](), autocast_adapter_dtype=autocast
    )
    add_reference_adapter(model)
    expected = torch.float32 if autocast else torch.bfloat16
    pairs = paired_parameters(model, "default")
    assert all(t.dtype == r.dtype == expected for _, t, r in pairs)
    assert all(torch.equal(t, r) for _, t, r in pairs)


def test_refresh_ema_matches_formula_and_hard_copy_is_exact():
    model = tiny_peft_model()
    add_reference_adapter(model)
    _perturb_trained(model)
    ref_before = adapter_tensors(model, REF_ADAPTER)
    trained = adapter_tensors(model, "default")
    refresh_reference_adapter(model, alpha=0.3)
    ref_after = adapter_tensors(model, REF_ADAPTER)
    for name in ref_before:
        expected = 0.3 * trained[name].double() + 0.7 * ref_before[name].double()
        torch.testing.assert_close(ref_after[name].double(), expected, rtol=0, atol=1e-7)
        assert not torch.equal(ref_after[name], ref_before[name])
    refresh_reference_adapter(model, alpha=1.0)
    for name, tensor in adapter_tensors(model, REF_ADAPTER).items():
        assert torch.equal(tensor, trained[name])


def test_mix_is_in_place_elementwise():
    ref, trained = [torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 6.0])]
    mix_(ref, trained, 0.25)
    assert torch.equal(ref[0], torch.tensor([1.5, 3.0]))


@pytest.mark.parametrize("variant", sorted(MIXABLE_CONFIGS))
def test_variant_pairs_and_hard_copy_gives_same_function(variant):
    model = get_peft_model(_base_model(), MIXABLE_CONFIGS[variant]())
    add_reference_adapter(model)
    assert model.active_adapter == "default"
    assert all(t.requires_grad and not r.requires_grad for _, t, r in paired_parameters(model, "default"))
    _perturb_trained(model)
    assert not torch.allclose(_logits(model, "default"), _logits(model, REF_ADAPTER))
    refresh_reference_adapter(model, alpha=1.0)
    torch.testing.assert_close(_logits(model, "default"), _logits(model, REF_ADAPTER), rtol=0, atol=0)


def test_adalora_and_full_models_are_rejected():
    adalora = get_peft_model(_base_model(), AdaLoraConfig(target_modules=TARGETS, r=4, total_step=10))
    with pytest.raises(ValueError, match="ADALORA"):
        check_supported_peft(adalora)
    with pytest.raises(ValueError, match="sync_ref_model"):
        add_reference_adapter(_base_model())


def test_mismatched_ref_adapter_is_rejected():
    model = get_peft_model(_base_model(), LoraConfig(target_modules=TARGETS, r=4))
    model.add_adapter(REF_ADAPTER, LoraConfig(target_modules=TARGETS, r=2))
    with pytest.raises(ValueError, match="do not pair"):
        paired_parameters(model, "default")


def test_save_load_roundtrip_and_step_check(tmp_path):
    model = tiny_peft_model()
    add_reference_adapter(model)
    _perturb_trained(model)
    refresh_reference_adapter(model)
    saved = adapter_tensors(model, REF_ADAPTER)
    save_reference_adapter(model, str(tmp_path), global_step=5, is_main_process=True)
    assert os.path.isfile(tmp_path / REF_ADAPTER_FILE)

    fresh = tiny_peft_model()
    add_reference_adapter(fresh)
    load_reference_adapter(fresh, str(tmp_path), global_step=5)
    for name, tensor in adapter_tensors(fresh, REF_ADAPTER).items():
        assert torch.equal(tensor, saved[name])
    with pytest.raises(ValueError, match="step 5"):
        load_reference_adapter(fresh, str(tmp_path), global_step=6)


def test_strip_reference_adapter_keeps_trained_adapter(tmp_path):
    model = tiny_peft_model()
    add_reference_adapter(model)
    model.save_pretrained(tmp_path)
    assert (tmp_path / REF_ADAPTER / "adapter_config.json").is_file()
    assert strip_reference_adapter(str(tmp_path)) is True
    assert not (tmp_path / REF_ADAPTER).exists()
    assert (tmp_path / "adapter_model.safetensors").is_file()
    assert strip_reference_adapter(str(tmp_path)) is False


def test_callback_rejects_bad_settings():
    with pytest.raises(ValueError, match="ref_adapter_mixup_alpha"):
        ReferenceAdapterCallback(sync_on="steps", sync_steps=2, mixup_alpha=2.0)


def test_lora_ema_delta_follows_documented_identity():
    """EMA of the factors: B'A' = a*BA + (1-a)*Br*Ar - a(1-a)(B-Br)(A-Ar), as the docs state."""
    model = tiny_peft_model()
    add_reference_adapter(model)
    _perturb_trained(model, scale=0.2)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    a_t, b_t = (
        layer.lora_A["default"].weight.detach().clone(),
        layer.lora_B["default"].weight.detach().clone(),
    )
    a_r, b_r = (
        layer.lora_A[REF_ADAPTER].weight.detach().clone(),
        layer.lora_B[REF_ADAPTER].weight.detach().clone(),
    )
    refresh_reference_adapter(model, alpha=0.25)
    new_delta = layer.lora_B[REF_ADAPTER].weight @ layer.lora_A[REF_ADAPTER].weight
    expected = 0.25 * b_t @ a_t + 0.75 * b_r @ a_r - 0.25 * 0.75 * (b_t - b_r) @ (a_t - a_r)
    torch.testing.assert_close(new_delta.detach(), expected, rtol=0, atol=1e-6)
    assert not torch.allclose(new_delta.detach(), 0.25 * b_t @ a_t + 0.75 * b_r @ a_r, atol=1e-6)
