"""Every pair of feature switches (grpo_hub.config.features.FEATURES) is refused at config time with both fields
named, or builds; the accepted pairs that share a seam (`Feature.seams`) train 2 steps with finite weights, and one
run trains every switch that builds together. Where the docs claim an equivalence, it holds for every combination
that allows it (packed == unpacked filtering; filtering with the 'all' denominator == no filtering). Validation's
outcome does not depend on the order of its checks, and it never changes the resolved config.

The pairs are generated from the table, so a new feature is covered by adding its row there. Config-time checks
run for every pair; the training runs carry the `slow` marker (CI runs them too).
"""

import dataclasses
import itertools
import math

import pytest
import torch

from grpo_hub.config import conflicts, features, resolve_and_validate
from grpo_hub.config.hub_config import GRPOHubConfig
from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import half_signal_dataset, half_signal_reward, make_trainer, tiny_config
from tests.training.dynamic.scripted import tool_trainer
from tests.training.helpers import ALL_NORMALISER, COMPAT_BASE, PACKABLE, outcome, trains
from tests.training.helpers import run as run_probed
from tests.training.reference.helpers import lora_config

SWITCHES = features.SWITCHES
merged = features.pair_settings
PAIRS = [(a, b) for a, b in itertools.combinations(SWITCHES, 2) if merged(a, b) is not None]


OUTCOMES = {pair: outcome(merged(*pair)) for pair in PAIRS}  # each pair built once, read by the tests below
ACCEPTED = [pair for pair in PAIRS if not isinstance(OUTCOMES[pair], ValueError)]


def names_a_field_of(message: str, feature: str) -> bool:
    return any(f"`{name}`" in message for name in SWITCHES[feature].example)


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_pair_is_refused_naming_both_fields_or_builds(first, second):
    result = OUTCOMES[first, second]
    if isinstance(result, ValueError):
        message = str(result)
        assert names_a_field_of(message, first) and names_a_field_of(message, second), message
        assert "Fix:" in message
    else:
        assert isinstance(result, GRPOHubConfig)
        rebuilt = dataclasses.replace(
            result, steps_per_generation=None
        )  # re-resolving changes nothing (TRL derives it)
        assert rebuilt.to_dict() == result.to_dict()


def test_every_switch_builds_alone():
    for name in SWITCHES:
        assert isinstance(outcome(SWITCHES[name].example), GRPOHubConfig), name


def test_validation_changes_nothing():
    for pair in ACCEPTED:
        before = OUTCOMES[pair].to_dict()
        resolve_and_validate.validate(OUTCOMES[pair])
        assert OUTCOMES[pair].to_dict() == before, pair


def test_refusals_do_not_depend_on_the_order_of_the_checks(monkeypatch):
    straight = {pair: isinstance(OUTCOMES[pair], ValueError) for pair in PAIRS}
    checks = [check for f in features.FEATURES for check in f.checks][::-1]
    validate = resolve_and_validate.validate
    monkeypatch.setattr(
        resolve_and_validate, "validate", lambda c: validate(c, checks, conflicts.CONFLICTS[::-1])
    )
    assert {pair: isinstance(outcome(merged(*pair)), ValueError) for pair in PAIRS} == straight


# --- training: every pair that builds and shares a seam trains 2 steps with finite weights, and so do all at once ---
TRAINED_PAIRS = [(a, b) for a, b in ACCEPTED if trains(a) and trains(b) and features.share_a_seam(a, b)]


def all_on() -> dict:
    """The example settings of every trainable switch that builds with those before it, in table order."""
    settings = {}
    for name in SWITCHES:
        example = SWITCHES[name].example
        clash = any(key in settings and settings[key] != value for key, value in example.items())
        if trains(name) and not clash and not isinstance(outcome({**settings, **example}), ValueError):
            settings = {**settings, **example}
    return settings


ALL_ON = all_on()


def test_pairs_that_share_no_seam_are_checked_at_config_time_only():
    untrained = [(a, b) for a, b in ACCEPTED if trains(a) and trains(b) and (a, b) not in TRAINED_PAIRS]
    assert untrained and all(not features.share_a_seam(a, b) for a, b in untrained)
    assert len(TRAINED_PAIRS) < len([(a, b) for a, b in ACCEPTED if trains(a) and trains(b)])


def train(tmp_path, model_dir, settings: dict, needs_peft: bool):
    trainer = make_trainer(
        GRPOHubTrainer,
        model_dir,
        tiny_config(tmp_path, **{**COMPAT_BASE, **settings}),
        reward_funcs=[half_signal_reward],
        dataset=half_signal_dataset(),
        peft_config=lora_config() if needs_peft else None,
    )
    trainer.train()
    return trainer


@pytest.mark.slow
@pytest.mark.parametrize(("first", "second"), TRAINED_PAIRS, ids=[f"{a}+{b}" for a, b in TRAINED_PAIRS])
def test_pair_trains_two_steps_with_finite_weights(tmp_path, tiny_model_dir, first, second):
    needs_peft = SWITCHES[first].needs_peft or SWITCHES[second].needs_peft
    trainer = train(tmp_path, tiny_model_dir, merged(first, second), needs_peft)
    assert trainer.state.global_step == 2
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(math.isfinite(v) for v in losses)


def on_in(settings: dict) -> list[str]:
    config = outcome(settings)
    return [name for name in SWITCHES if SWITCHES[name].is_on(config)]


@pytest.mark.slow
def test_every_switch_that_builds_together_trains_two_steps(tmp_path, tiny_model_dir):
    """One run with all of them: more than half the switches that train here (not the vLLM ones) at once, finite
    weights and losses."""
    assert len(on_in(ALL_ON)) > len([f for f in SWITCHES.values() if f.trains]) // 2, on_in(ALL_ON)
    needs_peft = any(SWITCHES[name].needs_peft for name in on_in(ALL_ON))
    trainer = train(tmp_path, tiny_model_dir, ALL_ON, needs_peft)
    assert trainer.state.global_step == 2
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


TURN_PAIRS = [
    (a, b)
    for a, b in ACCEPTED
    if "turn_advantages" in (a, b) and all(SWITCHES[n].trains and not SWITCHES[n].needs_peft for n in (a, b))
]


@pytest.mark.slow
@pytest.mark.parametrize(("first", "second"), TURN_PAIRS, ids=[f"{a}+{b}" for a, b in TURN_PAIRS])
def test_turn_pair_trains_two_steps_on_tool_rollouts(tmp_path, tiny_model_dir, first, second):
    """turn_advantages needs per-turn rewards of tool-calling rollouts: the scripted tool task of test_multi_turn."""
    settings = {"importance_sampling_level": None, **merged(first, second), "max_steps": 2}
    trainer = tool_trainer(tmp_path, tiny_model_dir, **settings)
    trainer.train()
    assert trainer.state.global_step == 2
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


# --- the documented equivalences, for every feature they allow ---
def test_equivalences_cover_most_features():
    assert {"gspo", "cispo", "dual_clip", "loss_agg_mode", "reward_clip", "adv_clip"} <= set(PACKABLE)
    assert {"gspo", "cispo", "dual_clip", "loss_agg_mode", "reward_clip", "adv_clip"} <= set(ALL_NORMALISER)


@pytest.mark.slow
@pytest.mark.parametrize("name", PACKABLE)
def test_packed_equals_unpacked_with(tmp_path, tiny_model_dir, name):
    settings = {
        **SWITCHES[name].example,
        "filter_zero_signal": True,
        "learning_rate": 0.0,
        "gradient_accumulation_steps": 2,
    }
    thin = run_probed(tmp_path, tiny_model_dir, **{**settings, "zero_signal_pack": False})
    packed = run_probed(tmp_path, tiny_model_dir, **{**settings, "zero_signal_pack": True})
    # dynamic sampling refills the batch with informative groups, so there is little or nothing to pack
    assert packed.forwards < thin.forwards or (
        name == "dynamic_sampling" and packed.forwards == thin.forwards
    )
    assert thin.grads and all(g.abs().sum() > 0 for g in thin.grads)
    for a, b in zip(packed.grads, thin.grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
