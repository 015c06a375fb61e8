"""The recipe's bad-input contract, over inputs generated from its fields: every bad value, as a flag or as a YAML
key, costs one line `grpo.py: error: ...` naming the field, exit status 2, no traceback, nothing written.

The values come from each field's type and documented range: a wrong type, an unknown choice, an empty value,
NaN, a number outside `grpo_hub.config.value_ranges` (TRL's, transformers', ModelConfig's and the recipe's own
ranges), and every invalid setting of grpo_hub's own fields (`INVALID`). They are fed in-process through the
recipe's parser (the checks precede any model or dataset load, so this is what the script does before it exits);
`test_the_script_itself_*` shows the real process gives the same line and writes nothing.
"""

import argparse
import json
import math
import re
import subprocess
import sys
import typing

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_hub import GRPOHubConfig
from grpo_hub.config import value_ranges
from grpo_hub.config.flag_values import admits, element
from tests.conftest import RUN_LIMIT_S
from tests.recipes.helpers import RECIPE, load_recipe, parse
from tests.training.distributed.launch import launch_env
from tests.training.helpers import INVALID

RECIPE_MODULE = load_recipe()
PARSER = RECIPE_MODULE.make_parser([])
ACTIONS = {a.dest: a for a in PARSER._actions if a.option_strings and a.dest not in ("help", "config")}
RANGES = value_ranges.CONFIG_RANGES + value_ranges.MODEL_RANGES + value_ranges.RECIPE_RANGES
DOC = RECIPE.parent.parent / "docs" / "validation.md"
NO_YAML = object()
ARGS_VALID_DICT_FIELDS = GRPOHubConfig._VALID_DICT_FIELDS
# text settings with a closed set of values that argparse does not know (value_ranges.check_model_*)
UNKNOWN_TEXT = {
    "lora_task_type": "BOGUS",
    "attn_implementation": "bogus",
    "model_name_or_path": "./no/such/folder",
    "reward_funcs": "no_such_reward",
}
# bounds whose owner is not value_ranges (vllm_checks.check_is_bounds: an IS bound is > 0)
OUTSIDE_ELSEWHERE = {"vllm_importance_sampling_clip_min": 0, "vllm_importance_sampling_clip_max": 0}


class Case(typing.NamedTuple):
    field: str
    why: str
    flags: tuple | None  # the argv tokens, or None where a flag cannot carry the value
    yaml_value: object = NO_YAML  # the YAML value, or NO_YAML where a YAML key cannot carry it


def _outside(rule: value_ranges.Range, integer: bool) -> list:
    """Values just outside the range (an open bound itself is outside), past the special values it also takes."""
    step = 1 if integer else 0.5
    values = []
    if rule.low is not None:
        value = rule.low if rule.open_low else rule.low - step
        values.append(value - step if value in rule.also else value)
    if rule.high is not None:
        value = rule.high if rule.open_high else rule.high + step
        values.append(value + step if value in rule.also else value)
    return [v for v in values if not rule.contains(v)]


def bad_values(name: str, action: argparse.Action, annotation) -> list[Case]:
    """The generated bad inputs of one field, from its type, choices and range."""
    item = element(annotation)
    kind = next((k for k in (bool, int, float, str) if admits(item, k)), None)
    kind = (
        str if kind is bool and admits(item, str) else kind
    )  # `str | Literal[False]`: any string is a value
    flag = f"--{name}"
    cases = []
    if action.choices:
        cases += [Case(name, "unknown choice", (flag, "no-such-choice"), "no-such-choice")]
        cases += [Case(name, "wrong type", None, 3)]
    elif kind is bool:
        cases += [
            Case(name, "not a truth value", (flag, "maybe"), "maybe"),
            Case(name, "wrong type", None, 2),
        ]
    elif kind in (int, float):
        cases += [Case(name, "wrong type", (flag, "abc"), "abc"), Case(name, "empty", (flag, ""), "")]
        cases += [Case(name, "wrong type", None, True), Case(name, "wrong type", None, {"a": 1})]
        if kind is int:
            cases += [Case(name, "fraction", (flag, "1.5"), 1.5)]
        else:
            cases += [Case(name, "NaN", (flag, "nan"), math.nan)]
    else:
        if not admits(annotation, dict):
            cases += [Case(name, "wrong type", None, {"a": 1})]
        if not admits(annotation, bool):
            cases += [Case(name, "wrong type", None, True)] if kind is str and action.nargs is None else []
    if kind is None:  # a mapping
        cases += [Case(name, "wrong type", None, [1, 2]), Case(name, "wrong type", None, 5)]
    if name in ARGS_VALID_DICT_FIELDS:
        cases += [
            Case(name, "not JSON", (flag, "{oops"), "{oops"),
            Case(name, "not a mapping", (flag, "nope"), "nope"),
        ]
    if action.nargs == "+":
        cases += [Case(name, "no value", (flag,))]
    if action.nargs is None and not admits(annotation, list) and kind is not None:
        cases += [Case(name, "wrong type", None, [1, 2])]
    if not admits(annotation, type(None)):
        cases += [Case(name, "null", None, None)]
    for rule in RANGES:
        if rule.field == name:
            for value in _outside(rule, kind is int):
                cases += [Case(name, f"outside {rule.describe()}", (flag, str(value)), value)]
    if name in OUTSIDE_ELSEWHERE:
        value = OUTSIDE_ELSEWHERE[name]
        cases += [Case(name, "outside > 0", (flag, str(value)), value)]
    if name in UNKNOWN_TEXT:
        cases += [Case(name, "unknown value", (flag, UNKNOWN_TEXT[name]), UNKNOWN_TEXT[name])]
    if name in value_ranges.NON_EMPTY:
        cases += [Case(name, "empty", (flag, ""), "")]
    return cases


def invalid_settings() -> list[Case]:
    """grpo_hub's own invalid settings (tests/training/helpers.py INVALID), each named by the field it refuses."""
    cases = []
    for name, kwargs in INVALID:
        tokens = []
        for key, value in kwargs.items():
            if isinstance(value, dict):  # a JSON object on the command line
                tokens += [f"--{key}", json.dumps(value)]
            else:
                tokens += [
                    f"--{key}",
                    "nan" if isinstance(value, float) and math.isnan(value) else str(value),
                ]
        cases.append(Case(name, f"invalid {kwargs}", tuple(tokens)))
    return cases


CASES = [
    case for name, action in ACTIONS.items() for case in bad_values(name, action, PARSER.annotations[name])
]
CASES += invalid_settings()


def answer(argv: list[str], capsys) -> tuple[int | None, str]:
    """(exit status, stderr) of parsing `argv` with the recipe's parser; status None when it parsed."""
    capsys.readouterr()
    try:
        parse(RECIPE_MODULE, *argv)
    except SystemExit as stop:
        return stop.code, capsys.readouterr().err
    return None, capsys.readouterr().err


def broken_contract(code, err: str, field: str) -> str | None:
    """What is wrong with the answer to a bad input naming `field`, or None."""
    if code != 2:
        return f"exit status {code}"
    if err.count("\n") != 1 or "Traceback" in err or not err.startswith("grpo.py: error: "):
        return f"not one error line: {err!r}"
    if not re.search(rf"`{field}`|--{field}\b|key {field}\b", err):
        return f"does not name {field}: {err.strip()}"
    return None


def test_every_generated_bad_input_costs_one_line_naming_the_field(capsys, tmp_path):
    failures, tried = [], 0
    for case in CASES:
        if case.flags is not None:
            tried += 1
            problem = broken_contract(
                *answer(["--output_dir", str(tmp_path / "out"), *case.flags], capsys), case.field
            )
            failures += [f"{case.flags} ({case.why}): {problem}"] if problem else []
        if case.yaml_value is not NO_YAML:
            tried += 1
            config = tmp_path / "bad.yaml"
            config.write_text(yaml.safe_dump({case.field: case.yaml_value}))
            problem = broken_contract(*answer(["--config", str(config)], capsys), case.field)
            failures += [f"YAML {case.field}: {case.yaml_value!r} ({case.why}): {problem}"] if problem else []
    assert not failures, f"{len(failures)} of {tried} bad inputs break the contract:\n" + "\n".join(failures)
    assert not (tmp_path / "out").exists()
    counts = re.search(r"tries (\d[\d,]*) bad inputs over (\d+) fields", DOC.read_text())
    assert counts and (counts[1].replace(",", ""), counts[2]) == (str(tried), str(len(ACTIONS))), (
        tried,
        len(ACTIONS),
    )


def test_every_field_gets_a_bad_input():
    assert {case.field for case in CASES} >= set(ACTIONS) - set(UNCHECKABLE), set(ACTIONS) - {
        c.field for c in CASES
    }


# Free-form strings whose every value is a value: a name, a path, a token, a URL.
UNCHECKABLE = ()


VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
KEYS = st.sampled_from(sorted(ACTIONS)) | st.text(min_size=1, max_size=8)


@settings(
    max_examples=int(__import__("os").environ.get("BAD_INPUT_EXAMPLES", 150)),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    config=st.dictionaries(KEYS, VALUES, max_size=4),
    parent=st.none() | st.dictionaries(KEYS | st.just("base"), VALUES, max_size=3),
)
def test_any_yaml_either_parses_or_costs_one_line(config, parent, capsys, tmp_path):
    """Nested mappings, lists, nulls, unicode keys, and a `base:` chain whose parent holds the same (or a `base:` of
    any type): the recipe either parses the file or answers one line, exit 2, never another exception."""
    if parent is not None:
        (tmp_path / "parent.yaml").write_text(yaml.safe_dump(parent, allow_unicode=True))
        config = {**config, "base": "parent.yaml"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config, allow_unicode=True))
    code, err = answer(["--config", str(tmp_path / "c.yaml"), "--max_steps", "1"], capsys)
    assert code is None or (code == 2 and err.count("\n") == 1 and err.startswith("grpo.py: error: ")), (
        code,
        err,
    )


@pytest.mark.parametrize(
    ("argv", "yaml_text", "line"),
    [
        (["--beta", "-1"], None, "grpo.py: error: `beta`: must be >= 0"),
        ([], "base: 7\n", "`base`: must be the path of a parent YAML file, got int 7"),
        ([], "temperature: [1, 2]\n", "grpo.py: error: `temperature`: got list [1, 2]"),
        (["--per_device_train_batch_size", "3"], None, "grpo.py: error: `per_device_train_batch_size`: "),
    ],
    ids=["flag-range", "yaml-base", "yaml-type", "flag-groups"],
)
def test_the_script_itself_answers_one_line_and_writes_nothing(tmp_path, argv, yaml_text, line):
    if yaml_text is not None:
        (tmp_path / "c.yaml").write_text(yaml_text)
        argv = [*argv, "--config", str(tmp_path / "c.yaml")]
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(RECIPE), *argv, "--output_dir", str(out)],
        cwd=tmp_path, env=launch_env(), capture_output=True, text=True, timeout=RUN_LIMIT_S,
    )  # fmt: skip
    errors = [ln for ln in done.stderr.splitlines() if "error" in ln.lower() or "Traceback" in ln]
    assert done.returncode == 2 and len(errors) == 1 and line in errors[0], done.stderr[-2000:]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"] * (
        yaml_text is not None
    )


def test_target_modules_the_model_lacks_are_one_line_after_loading(capsys, tmp_path):
    args = parse(RECIPE_MODULE, "--task", "digits", "--use_peft", "true", "--lora_target_modules", "nope",
                 "--output_dir", str(tmp_path / "out"))  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        RECIPE_MODULE.main(*args)
    errors = [
        line
        for line in capsys.readouterr().err.splitlines()
        if "error" in line.lower() or "Traceback" in line
    ]
    assert stop.value.code == 2 and len(errors) == 1  # (after transformers' weight-loading bar)
    assert errors[0].startswith("grpo.py: error: `lora_target_modules`: Target modules nope not found"), (
        errors
    )
