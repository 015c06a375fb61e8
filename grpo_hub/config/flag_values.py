"""A recipe's input, value by value: a YAML key checked as its flag would be, and argparse's complaints reworded
as field errors ("`field`: problem Fix: fix").

argparse converts and checks what comes on the command line (`--temperature abc` is refused), but a YAML
`--config` reaches the parser as defaults, which it neither converts (unless a string) nor checks against the
field's choices: `temperature: [1, 2]` or `task: nosuchtask` would surface as a traceback deep inside TRL.
`yaml_value` gives a YAML value the flag's checks.
"""

from __future__ import annotations

import argparse
import re
import typing

from grpo_hub.config.validation import union_members
from grpo_hub.errors import field_message

ARGPARSE_ERROR = re.compile(r"^argument (--[\w-]+)(?:/--[\w-]+)*: (.*)$", re.DOTALL)
TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
PLURALS = {int: "integers", float: "numbers", str: "strings", bool: "true/false values"}


def admits(annotation, kind: type) -> bool:
    """Whether a field annotated `annotation` takes a value of Python type `kind` (None, dict, list, bool)."""
    for member in union_members(annotation):
        origin = typing.get_origin(member) or member
        if origin is typing.Literal:
            if any(isinstance(choice, kind) for choice in typing.get_args(member)):
                return True
        elif (
            isinstance(origin, type)
            and issubclass(origin, kind)
            and not (origin is bool and kind is not bool)
        ):
            return True
    return False


def element(annotation):
    """The annotation of one item of a list field (`list[float] | None` -> `float`), else `annotation`."""
    for member in union_members(annotation):
        if typing.get_origin(member) is list:
            return typing.get_args(member)[0]
    return annotation


def expected(action: argparse.Action, annotation) -> str:
    """What the flag takes, in words: 'one of a, b', 'an integer', 'true or false', 'or null' where it takes None."""
    if action.choices:
        words = "one of " + ", ".join(map(str, action.choices))
    else:
        kinds = [kind for kind in (bool, int, float, str) if admits(element(annotation), kind)]
        words = TYPE_WORDS[kinds[0]] if kinds else "a value"
        if action.nargs in ("+", "*"):
            words = f"a list of {PLURALS[kinds[0]] if kinds else 'values'}"
    return words + (" (or null)" if admits(annotation, type(None)) else "")


def _converted(action: argparse.Action, annotation, value):
    """One scalar as the flag would have it; raises ValueError when the flag would refuse it."""
    if isinstance(value, bool):
        if not admits(annotation, bool):
            raise ValueError
        converted = value
    elif isinstance(value, str):
        mapping_only = action.type is str and action.nargs is None and not admits(annotation, str)
        if mapping_only:  # e.g. liger_kernel_config: no JSON text is read for it
            raise ValueError
        converted = action.type(value) if action.type else value
    elif isinstance(value, int | float):
        if admits(annotation, type(value)) or (isinstance(value, int) and admits(annotation, float)):
            converted = value
        elif action.type is str:
            converted = str(value)
        else:
            raise ValueError
    else:
        raise ValueError
    if action.choices and str(converted) not in map(str, action.choices):
        raise ValueError
    return converted


def yaml_value(action: argparse.Action, annotation, key: str, value):
    """The value of YAML key `key`, checked and converted as `--key value` would be; the field error otherwise."""
    shown = "null" if value is None else f"{type(value).__name__} {value!r}"
    try:
        if value is None:
            if not admits(annotation, type(None)):
                raise ValueError
            return None
        if isinstance(value, dict):
            if not admits(annotation, dict):
                raise ValueError
            return value
        if isinstance(value, list):
            if action.nargs not in ("+", "*") and not admits(annotation, list):
                raise ValueError
            if not value and action.nargs == "+":
                raise ValueError
            return [_converted(action, element(annotation), item) for item in value]
        return _converted(action, annotation, value)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        raise ValueError(
            field_message(
                key, f"got {shown}, which --{key} does not take.", f"give {expected(action, annotation)}."
            )
        ) from None


def argparse_field_error(message: str, actions: list[argparse.Action], annotations: dict) -> str:
    """argparse's "argument --max_steps/--max-steps: invalid int value: 'many'" as a field error naming the field and
    what it takes; any other message unchanged."""
    match = ARGPARSE_ERROR.match(message)
    if not match:
        return message
    flag, problem = match.groups()
    action = next((a for a in actions if flag in a.option_strings), None)
    if action is None:
        return message
    problem = " ".join(problem.split()).rstrip(".")
    return field_message(action.dest, f"{problem}.", f"give {expected(action, annotations[action.dest])}.")
