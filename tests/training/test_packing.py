"""Packing under filtering: fewer micro-steps run, the optimizer-step gradient is today's filtering gradient
(and, with zero_signal_normalizer="all", TRL's unfiltered one), across accumulation layouts."""

import pytest
import torch

from tests.helpers import constant_reward, tiny_config
from tests.training.helpers import run

LAYOUTS = {
    "steps=accumulation=2": {"gradient_accumulation_steps": 2},
    "num_iterations=2": {"gradient_accumulation_steps": 2, "num_iterations": 2},
    "steps=4,accumulation=2": {"gradient_accumulation_steps": 2, "steps_per_generation": 4},
    "steps=2,accumulation=4": {"gradient_accumulation_steps": 4, "steps_per_generation": 2, "max_steps": 1},
    "steps=3,accumulation=2": {"gradient_accumulation_steps": 2, "steps_per_generation": 3, "max_steps": 3},
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_packing_runs_fewer_micro_steps_with_the_same_gradient(tmp_path, tiny_model_dir, layout):
    thin = run(tmp_path, tiny_model_dir, filter_zero_signal=True, zero_signal_pack=False, **layout)
    packed = run(tmp_path, tiny_model_dir, filter_zero_signal=True, **layout)
    assert len(packed.grads) == len(thin.grads) == layout.get("max_steps", 2)
    assert packed.forwards < thin.forwards
    assert all(g.abs().sum() > 0 for g in thin.grads)
    for a, b in zip(packed.grads, thin.grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert packed.logs and not thin.logs


def test_all_filtered_batch_runs_one_pad_micro_step(tmp_path, tiny_model_dir):
    probe = run(
        tmp_path, tiny_model_dir, constant_reward, filter_zero_signal=True, gradient_accumulation_steps=2
    )
    assert probe.forwards == 2  # one per optimizer step (it ends the step), none for the empty micro-step
    assert all(g.abs().sum() == 0 for g in probe.grads)


def test_explicit_packing_that_cannot_apply_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="zero_signal_pack.*no effect without filter_zero_signal"):
        tiny_config(tmp_path, zero_signal_pack=True)
    with pytest.raises(ValueError, match="zero_signal_pack.*bnpo"):
        tiny_config(tmp_path, zero_signal_pack=True, filter_zero_signal=True, loss_type="bnpo")
    assert not tiny_config(tmp_path, filter_zero_signal=True, loss_type="bnpo").packs_rows
    assert tiny_config(tmp_path, filter_zero_signal=True).packs_rows
    # issue 25, defect 2: TRL's entropy bonus is a token mean per micro-batch, so packing would change it
    assert not tiny_config(tmp_path, filter_zero_signal=True, entropy_coef=0.01).packs_rows
    with pytest.raises(ValueError, match="`zero_signal_pack` with `entropy_coef`"):
        tiny_config(tmp_path, filter_zero_signal=True, zero_signal_pack=True, entropy_coef=0.01)
