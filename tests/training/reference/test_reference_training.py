"""Reference adapter inside real GRPO runs (tiny local model, CPU): refresh schedule, KL, gradients, resume."""

import shutil

import pytest
import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from grpo_hub.training.distributed import unwrap_peft_model
from grpo_hub.training.reference import REF_ADAPTER, REF_ADAPTER_FILE, ReferenceAdapterCallback

from .helpers import (
    adapter_tensors,
    char_code_reward,
    grpo_args,
    prompt_dataset,
    tiny_peft_model,
    tiny_tokenizer,
)


class Probe(TrainerCallback):
    """Records both adapters after every optimizer step (registered after the refresh callback)."""

    def __init__(self):
        self.trained, self.ref, self.ref_flags = {}, {}, {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        peft_model = unwrap_peft_model(model)
        step = state.global_step
        self.trained[step] = adapter_tensors(peft_model, "default")
        self.ref[step] = adapter_tensors(peft_model, REF_ADAPTER)
        ref_params = [p for n, p in peft_model.named_parameters() if f".{REF_ADAPTER}." in n]
        self.ref_flags[step] = (
            any(p.requires_grad for p in ref_params),
            any(p.grad is not None for p in ref_params),
        )


def _train(output_dir, callback, resume=None, n_rows=24, **overrides):
    probe = Probe()
    trainer = GRPOTrainer(
        model=tiny_peft_model(),
        reward_funcs=char_code_reward,
        args=grpo_args(output_dir, **overrides),
        train_dataset=prompt_dataset(n_rows),
        processing_class=tiny_tokenizer(),
        callbacks=[callback, probe],
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer, probe


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _logged(trainer, key: str) -> dict[int, float]:
    return {row["step"]: row[key] for row in trainer.state.log_history if key in row}


def test_hard_refresh_copies_adapter_and_kl_drops_to_zero(tmp_path):
    callback = ReferenceAdapterCallback(sync_on="steps", sync_steps=3, mixup_alpha=1.0)
    trainer, probe = _train(tmp_path, callback, max_steps=7)
    assert callback.refreshed_at == [3, 6]
    for step in (3, 6):
        assert _equal(probe.ref[step], probe.trained[step])
    for step in (4, 5):  # frozen between refreshes, while the trained adapter moves on
        assert _equal(probe.ref[step], probe.ref[3])
        assert not _equal(probe.ref[step], probe.trained[step])
    assert _equal(probe.ref[2], probe.ref[1])
    kl = _logged(trainer, "kl")
    # Step 4 and 7 are the first steps after a refresh: policy == reference, so the logged KL is 0.
    assert kl[4] < 1e-7 and kl[7] < 1e-7
    assert max(kl[2], kl[3]) > 1e-4 and max(kl[5], kl[6]) > 1e-4

    assert not any(flags[0] or flags[1] for flags in probe.ref_flags.values())  # no requires_grad, no grad
    ref_ids = {id(p) for n, p in trainer.model.named_parameters() if f".{REF_ADAPTER}." in n}
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert ref_ids and not ref_ids & optimised
    assert trainer.model.active_adapter == "default"


def test_ema_refresh_matches_independent_expectation(tmp_path):
    alpha = 0.5
    callback = ReferenceAdapterCallback(sync_on="steps", sync_steps=2, mixup_alpha=alpha)
    _, probe = _train(tmp_path, callback, max_steps=4)
    assert callback.refreshed_at == [2, 4]
    for step in (2, 4):
        before = probe.ref[step - 1]
        for name, trained in probe.trained[step].items():
            expected = alpha * trained.double() + (1 - alpha) * before[name].double()
            torch.testing.assert_close(probe.ref[step][name].double(), expected, rtol=0, atol=1e-7)
        assert not _equal(probe.ref[step], probe.trained[step])
        assert not _equal(probe.ref[step], before)


def test_epoch_refresh_happens_at_epoch_ends(tmp_path):
    callback = ReferenceAdapterCallback(sync_on="epoch", mixup_alpha=1.0)
    # 2 prompts x 4 generations / 4 completions per step = 2 steps per epoch.
    trainer, probe = _train(tmp_path, callback, max_steps=-1, num_train_epochs=2, n_rows=2)
    assert trainer.state.global_step == 4
    assert callback.refreshed_at == [2, 4]
    # on_epoch_end runs after the step's on_step_end (where Probe records), so the step-2 refresh shows at step 3.
    assert _equal(probe.ref[1], probe.ref[2]) and not _equal(probe.ref[2], probe.trained[2])
    assert all(
        not t.any() for n, t in probe.ref[2].items() if ".lora_B." in n
    )  # still the initial zero delta
    assert _equal(probe.ref[3], probe.trained[2]) and _equal(probe.ref[4], probe.trained[2])
    assert _equal(adapter_tensors(trainer.model, REF_ADAPTER), probe.trained[4])


def test_resume_continues_with_the_saved_reference(tmp_path):
    """6 steps straight == 3 steps + resume + 3 steps: same reference, same trained adapter, same losses."""
    settings = dict(max_steps=6, save_strategy="steps", save_steps=3, full_determinism=True)
    straight_cb = ReferenceAdapterCallback(sync_on="steps", sync_steps=2)
    straight, straight_probe = _train(tmp_path / "straight", straight_cb, **settings)
    checkpoint = tmp_path / "straight" / "checkpoint-3"
    assert (checkpoint / REF_ADAPTER_FILE).is_file()
    assert not (checkpoint / REF_ADAPTER).exists()  # stored once, in ref_adapter.safetensors

    resumed_dir = tmp_path / "resumed"
    shutil.copytree(checkpoint, resumed_dir / "checkpoint-3")
    resumed_cb = ReferenceAdapterCallback(sync_on="steps", sync_steps=2)
    resumed, resumed_probe = _train(
        resumed_dir, resumed_cb, resume=str(resumed_dir / "checkpoint-3"), **settings
    )

    assert resumed_cb.refreshed_at == [4, 6]
    # The reference at step 4 (before its refresh it was the step-2 copy) comes from the checkpoint.
    assert not _equal(straight_probe.ref[3], straight_probe.trained[3])
    for step in (4, 5, 6):
        for name, tensor in straight_probe.ref[step].items():
            torch.testing.assert_close(resumed_probe.ref[step][name], tensor, rtol=0, atol=1e-6)
        for name, tensor in straight_probe.trained[step].items():
            torch.testing.assert_close(resumed_probe.trained[step][name], tensor, rtol=0, atol=1e-6)
    straight_kl, resumed_kl = _logged(straight, "kl"), _logged(resumed, "kl")
    straight_loss, resumed_loss = _logged(straight, "loss"), _logged(resumed, "loss")
    assert straight_kl[4] > 1e-4  # the KL of step 4 is measured against the step-2 reference
    for step in (4, 5, 6):
        assert abs(resumed_kl[step] - straight_kl[step]) <= 1e-6 + 1e-4 * abs(straight_kl[step])
        assert abs(resumed_loss[step] - straight_loss[step]) <= 1e-6 + 1e-4 * abs(straight_loss[step])


def test_resume_without_saved_reference_fails_loudly(tmp_path):
    callback = ReferenceAdapterCallback(sync_on="steps", sync_steps=2)
    _train(tmp_path / "a", callback, max_steps=2, save_strategy="steps", save_steps=2)
    checkpoint = tmp_path / "a" / "checkpoint-2"
    (checkpoint / REF_ADAPTER_FILE).unlink()
    with pytest.raises(ValueError, match="resume_from_checkpoint"):
        _train(
            tmp_path / "b", ReferenceAdapterCallback(sync_on="steps", sync_steps=2), resume=str(checkpoint)
        )
