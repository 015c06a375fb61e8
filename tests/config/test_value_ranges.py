"""grpo_hub.config.value_ranges against naive rules: ranges, whole groups per generation batch, the suggested fix."""

import random
import re
from types import SimpleNamespace

import pytest

from grpo_hub.config import value_ranges
from grpo_hub.config.value_ranges import Range


def settings(**kwargs):
    base = {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": None,
        "generation_batch_size": None,
        "num_generations": 4,
        "eval_strategy": "no",
        "per_device_eval_batch_size": 8,
        "num_generations_eval": None,
    }
    return SimpleNamespace(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("rule", "inside", "outside", "text"),
    [
        (Range("x", 0, open_low=True), [1e-9, 5], [0, -1], "> 0"),
        (Range("x", 1, also=(-1,)), [-1, 1, 7], [0, -2], ">= 1 or -1"),
        (Range("x", 0, 1, open_high=True), [0, 0.5], [1, -0.1], "in [0, 1)"),
        (Range("x", 0, 1, open_low=True), [1, 0.3], [0, 1.1], "in (0, 1]"),
    ],
)
def test_a_range_holds_what_it_says(rule, inside, outside, text):
    assert rule.describe() == text
    assert all(rule.contains(v) for v in inside) and not any(rule.contains(v) for v in outside)
    assert rule.contains(rule.example())


def test_every_range_example_is_inside_and_every_field_is_named_once():
    tables = value_ranges.CONFIG_RANGES + value_ranges.MODEL_RANGES
    assert all(rule.contains(rule.example()) for rule in tables)
    names = [rule.field for rule in tables]
    assert len(names) == len(set(names))


def test_check_ranges_names_the_field_and_skips_none_and_other_types():
    with pytest.raises(ValueError, match=r"^`beta`: must be >= 0, got -1\. Fix: set beta >= 0, e.g\. 0\.$"):
        value_ranges.check_ranges(SimpleNamespace(beta=-1), (Range("beta", 0),))
    for value in (None, "text", True, 3):
        value_ranges.check_ranges(SimpleNamespace(beta=value), (Range("beta", 0),))
    with pytest.raises(ValueError, match="`beta`"):
        value_ranges.check_ranges(SimpleNamespace(beta=float("inf")), (Range("beta", 0),))


def test_groups_fit_against_a_naive_rule_and_the_fix_fits():
    rng = random.Random(0)
    for _ in range(2000):
        per_device, processes = rng.randint(1, 12), rng.randint(1, 4)
        steps, groups = rng.randint(1, 4), rng.randint(2, 9)
        c = settings(
            per_device_train_batch_size=per_device, steps_per_generation=steps, num_generations=groups
        )
        fits = (per_device * processes * steps) % groups == 0
        try:
            value_ranges.check_groups_fit(c, processes)
            assert fits
        except ValueError as error:
            assert not fits and str(error).startswith("`per_device_train_batch_size`")
            suggested = int(re.search(r"a multiple of (\d+)", str(error))[1])
            assert (suggested * processes * steps) % groups == 0
            assert all(
                (b * processes * steps) % groups for b in range(1, suggested)
            )  # the smallest that fits


def test_a_set_generation_batch_is_named_and_both_sizes_are_a_conflict():
    with pytest.raises(ValueError, match="^`generation_batch_size`: a generation batch of 6"):
        value_ranges.check_groups_fit(settings(per_device_train_batch_size=2, generation_batch_size=6), 1)
    with pytest.raises(ValueError, match="^`generation_batch_size`: 6 is not a whole number"):
        value_ranges.check_groups_fit(settings(per_device_train_batch_size=4, generation_batch_size=6), 1)
    with pytest.raises(ValueError, match="`generation_batch_size` with `steps_per_generation`"):
        value_ranges.check_groups_fit(settings(generation_batch_size=8, steps_per_generation=1), 1)
    with pytest.raises(ValueError, match="^`per_device_eval_batch_size`"):
        value_ranges.check_groups_fit(settings(eval_strategy="steps", per_device_eval_batch_size=3), 1)
    value_ranges.check_groups_fit(
        settings(eval_strategy="steps", per_device_eval_batch_size=3, num_generations_eval=1), 1
    )
