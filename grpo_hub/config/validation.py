"""Config validation shared by every field: the value checks that apply to all fields alike (type, finiteness,
effect), each raising `grpo_hub.errors.field_error`."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Mapping

from grpo_hub.errors import field_error


def union_members(annotation) -> tuple:
    """`int | None` -> (int, NoneType); any other annotation -> (annotation,)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)
    return (annotation,)


def _allowed_types(annotation) -> tuple[type, ...]:
    """`float | None` -> (float, int, NoneType): an int is a valid float (as for TrlParser), a bool is neither."""
    allowed = tuple(m for m in union_members(annotation) if isinstance(m, type))
    return (*allowed, int) if float in allowed else allowed


def check_type(field_name: str, value, annotation) -> None:
    """Raise unless `value` has the field's annotated type (bool is not accepted as an int or a float)."""
    allowed = _allowed_types(annotation)
    if not allowed:  # an annotation this check cannot read: leave it to the field's own checks
        return
    wrong_bool = isinstance(value, bool) and bool not in allowed
    if wrong_bool or not isinstance(value, allowed):
        names = " or ".join(
            [t.__name__ for t in allowed if t is not type(None)] + ["None"] * (type(None) in allowed)
        )
        field_error(
            field_name,
            f"must be {names}, got {type(value).__name__} {value!r}.",
            f"give a value of type {names}.",
        )


def check_finite(field_name: str, value, *, off: str = "None") -> None:
    """Raise when a float bound is NaN or infinite (`nan` passes every `<`/`<=` check); `off` names how to disable."""
    if isinstance(value, float) and not math.isfinite(value):
        field_error(
            field_name, f"must be a finite number, got {value}.", f"use a finite value, or {off} for off."
        )


def check_choice(field_name: str, value, choices, *, optional: bool = False) -> None:
    """Raise unless `value` is one of `choices` (or None, when `optional`: the field's "off")."""
    if (value is None and optional) or value in choices:
        return
    field_error(
        field_name, f"{value!r} is not supported.", f"use one of {choices}{' or None' if optional else ''}."
    )


def check_positive(field_name: str, bound: float | None) -> None:
    """Raise unless an optional bound is None (off) or > 0."""
    if bound is not None and bound <= 0:
        field_error(field_name, f"must be > 0, got {bound}.", "use a positive bound or None.")


def check_effect(
    config, needs: Mapping[str, tuple[str, Callable[[typing.Any], bool]]], defaults: Mapping
) -> None:
    """Raise for a field set explicitly (its value differs from its default) whose switch is off.

    `needs` maps a field to (the setting it needs, a predicate on the config that is True when it applies).
    """
    for name, (switch, applies) in needs.items():
        value = getattr(config, name)
        if value != defaults[name] and not applies(config):
            field_error(
                name,
                f"is set to {value!r} but has no effect without {switch}.",
                f"set {switch}, or leave {name} at its default {defaults[name]!r}.",
            )


def conflict_error(
    first: str, second: str, problem: str, fix: str, implied_by: Mapping | None = None
) -> None:
    """Raise the ValueError of two settings refused together: "`first` with `second`: problem Fix: fix".

    `implied_by` maps a switch the config turned on itself to the one the user set, which the message names too.
    """
    names = [
        f"`{name}` (implied by `{implied_by[name]}`=True)"
        if implied_by and name in implied_by
        else f"`{name}`"
        for name in (first, second)
    ]
    raise ValueError(f"{names[0]} with {names[1]}: {problem} Fix: {fix}")
