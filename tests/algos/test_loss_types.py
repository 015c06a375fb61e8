"""The loss-type registry: every TRL loss type is known to TRL 1.16, and each denominator matches TRL's code."""

import inspect

import pytest

from grpo_hub.algos import loss_types
from grpo_hub.algos.losses import AGG_MODES, SEQ_MEAN_AGG_MODES


def trl_loss_source() -> str:
    from trl import GRPOTrainer

    return inspect.getsource(GRPOTrainer._compute_loss)


def test_every_trl_loss_type_is_handled_by_trl():
    source = trl_loss_source()
    for name in loss_types.TRL_NAMES:
        assert f'"{name}"' in source, name
    assert set(loss_types.NAMES) - set(loss_types.TRL_NAMES) == {"gspo"}


@pytest.mark.parametrize(
    ("denominator", "trl_expression"),
    [
        (loss_types.BATCH_TOKENS, 'inputs["num_items_in_batch"]'),
        (loss_types.MICRO_TOKENS, "loss = (per_token_loss * mask).sum() / mask.sum()"),
    ],
)
def test_token_denominators_match_trl(denominator, trl_expression):
    """Each TRL branch that divides by the given token count lists exactly the registry's loss types."""
    source = trl_loss_source()
    aggregation = source[source.index('mode = "train" if self.model.training') :]  # after the surrogate
    names = {
        n for n, t in loss_types.REGISTRY.items() if t.denominator == denominator and t.trl_loss_type == n
    }
    for block in aggregation.split("self.loss_type")[1:]:
        head = block.split(":")[0]
        listed = {n for n in loss_types.TRL_NAMES if f'"{n}"' in head}
        if trl_expression in block:
            assert listed <= names, (denominator, listed)
            names -= listed
    assert not names, f"{names} not found in TRL's {denominator} branch"


def test_loss_agg_mode_replaces_the_denominator():
    for name in loss_types.NAMES:
        assert loss_types.denominator_kind(name, None) == loss_types.REGISTRY[name].denominator
        assert loss_types.denominator_kind(name, "token-mean") == loss_types.BATCH_TOKENS
        for mode in SEQ_MEAN_AGG_MODES:
            assert loss_types.denominator_kind(name, mode) == loss_types.ROWS
    for name in loss_types.OWN_PATH_NAMES:
        agg = loss_types.own_path_agg_mode(name, None)
        assert agg in AGG_MODES
        assert loss_types.denominator_kind(name, agg) == loss_types.REGISTRY[name].denominator


def test_presets_run_a_trl_loss_type():
    for loss in loss_types.REGISTRY.values():
        assert loss.trl_loss_type in loss_types.TRL_NAMES
        assert loss.denominator == loss_types.REGISTRY[loss.trl_loss_type].denominator
