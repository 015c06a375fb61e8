"""A recipe's command line: flags and `--config` YAML parsed into its dataclasses by TRL's `TrlParser`, every
complaint one line naming the field (exit status 2) instead of a traceback or the usage screen.

Unknown flags and YAML keys get the closest known name, prefixes of flags are refused (`allow_abbrev=False`),
argparse's refusals name the field and what it takes (`flag_values.argparse_field_error`), YAML values are checked
as their flag would be (`flag_values.yaml_value`), a YAML file may name a parent (`base:`, `config_files`) and export
variables (`env:`), and every value the dataclasses refuse when built (GRPOHubConfig's checks, TRL's and
transformers' own) or the recipe's own `check_parsed` refuses is one line too. The recipe's own arguments are checked
here as well: their ranges and placement flags (`check_recipe_arguments`), the reward functions and their weights
(`check_reward_choice`).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence

import yaml
from trl import TrlParser

from grpo_hub.config import config_files, flag_values, value_ranges
from grpo_hub.errors import field_error
from grpo_hub.generation import server_process

PROG = "grpo.py"  # the recipe, as its errors name it


def fail(message: str):
    """Exit with argparse's status 2 after one line on stderr: no traceback, no usage screen (it lists every field)."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)  # a YAML key may hold a newline
    sys.stderr.write(f"{PROG}: error: {line}\n")
    raise SystemExit(2)


def unknown_name(kind: str, name: str, known: list[str]) -> str:
    """'unknown flag --learnig_rate (did you mean --learning_rate?)': the closest known name, when one is close."""
    close = difflib.get_close_matches(name, known, n=1)
    return f"unknown {kind} {name}" + (f" (did you mean {close[0]}?)" if close else "")


def read_config(path: str) -> dict:
    """The `--config` YAML as a mapping, merged over the parent it names (`base:`, see `config_files`); a missing,
    unreadable or non-mapping file is a one-line error."""
    try:
        return config_files.read_config(path)
    except OSError as error:
        fail(f"--config {path}: {error.strerror}")
    except yaml.YAMLError as error:
        fail(f"--config {path}: not valid YAML ({' '.join(str(error).split())})")
    except ValueError as error:
        fail(f"--config {path}: {error}")


def requested_task(argv: Sequence[str], known_tasks: Iterable[str], default: str) -> str:
    """The task named by `--task`, else by the `--config` YAML, else `default` (read before parsing, so the parser's
    defaults can be that task's); an unknown task in the YAML is left for the parser to refuse."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--task")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(list(argv))
    if known.task:
        return known.task
    task = read_config(known.config).get("task") if known.config else None
    return task if isinstance(task, str) and task in known_tasks else default


def check_recipe_arguments(args, heldout_per_level: Mapping[str, int]) -> None:
    """The recipe's own arguments (`RecipeArguments`): their ranges, the local server's placement flags (which need
    `--vllm_server_start`; cores must parse), and the held-out evaluation's: `eval_pass_k` (arithmetic only) and
    `eval_per_level` (a scored task, a key of `heldout_per_level`, and at most the problems per level it holds out)."""
    value_ranges.check_ranges(args, value_ranges.RECIPE_RANGES)
    for name in ("vllm_server_cores", "vllm_server_gpus"):
        if getattr(args, name) is not None and not args.vllm_server_start:
            field_error(
                name,
                "places the local vLLM server, which only --vllm_server_start true starts.",
                f"add --vllm_server_start true, or drop --{name}.",
            )
    if args.vllm_server_cores is not None:
        server_process.parse_cores(args.vllm_server_cores)
    if args.eval_pass_k and args.task != "arithmetic":
        field_error(
            "eval_pass_k",
            f"is reported for --task arithmetic only, got --task {args.task}.",
            "drop --eval_pass_k.",
        )
    chosen, available = args.eval_per_level, heldout_per_level.get(args.task)
    if chosen is not None and available is None:
        field_error(
            "eval_per_level",
            f"sizes the held-out evaluation of tasks {sorted(heldout_per_level)}; --task {args.task} has none.",
            "drop --eval_per_level.",
        )
    if chosen is not None and chosen > available:
        field_error(
            "eval_per_level",
            f"{chosen} problems per level, but task {args.task!r} holds out {available} per level.",
            f"give at most {available}, or drop --eval_per_level for all of them.",
        )


def check_reward_choice(args, weights: Sequence[float] | None, reward_funcs_of: Callable) -> None:
    """The reward functions a run trains on: `args.reward_funcs` (`RecipeArguments`) names functions
    `reward_funcs_of(args.task, names)` accepts (its ValueError, an unknown or repeated name, becomes the field's
    error), and `weights` (`--reward_weights`) has one weight per function. The lookup is the recipe's
    (`grpo_hub.tasks.get_reward_funcs`: tasks sit above config)."""
    try:
        rewards = len(reward_funcs_of(args.task, args.reward_funcs))
    except ValueError as error:
        field_error("reward_funcs", f"{error}.", "name only those, each once, or drop --reward_funcs.")
    if weights is not None and len(weights) != rewards:
        field_error(
            "reward_weights",
            f"{len(weights)} weights for the {rewards} reward function(s) of this run "
            f"(task {args.task!r}, reward_funcs {args.reward_funcs}).",
            f"give {rewards} weight(s), or drop --reward_weights.",
        )


class RecipeParser(TrlParser):
    """TrlParser over `dataclass_types` whose every complaint is one line naming the field (module docstring);
    `check_parsed(*dataclasses)` checks what the parsed values decide together."""

    def __init__(self, dataclass_types, check_parsed: Callable[..., None] = lambda *parsed: None):
        super().__init__(dataclass_types, allow_abbrev=False)
        self.check_parsed = check_parsed
        self.annotations = {
            name: annotation
            for kind in dataclass_types
            for name, annotation in typing.get_type_hints(kind).items()
        }

    def error(self, message: str):
        fail(flag_values.argparse_field_error(message, self._actions, self.annotations))

    def parse_args_and_config(self, args=None, **kwargs):
        args = list(sys.argv[1:] if args is None else args)
        flags = sorted(flag for action in self._actions for flag in action.option_strings)
        for token in args:
            flag = token.split("=", 1)[0]
            if flag.startswith("--") and flag not in ("--", "--config") and flag not in flags:
                fail(unknown_name("flag", flag, flags))
        if "--config" in args:  # read here (TrlParser would not follow `base:`), then parsed as TRL does
            at = args.index("--config")
            if at + 1 == len(args):
                fail("--config needs a YAML file. Fix: --config PATH.")
            self.set_defaults_with_config(**self.yaml_settings(args[at + 1]))
            args = args[:at] + args[at + 2 :]
        try:  # a value a dataclass or check_parsed refuses is a ValueError whose message names the field
            parsed = super().parse_args_and_config(args, **kwargs)
            self.check_parsed(*parsed)
        except ValueError as error:
            fail(" ".join(str(error).split()))
        return parsed

    def yaml_settings(self, path: str) -> dict:
        """The `--config` file's settings, each checked as its flag would be; its `env:` mapping is exported."""
        config = read_config(path)
        actions = {action.dest: action for action in self._actions if action.option_strings}
        for key in config:
            if key != "env" and key not in actions:
                fail(f"{unknown_name('key', str(key), sorted(actions))} in --config {path}")
        env = config.pop("env", None)
        env = {} if env is None else env
        if not isinstance(env, dict):
            fail(
                f"`env`: must map variable names to values, got {env!r} (in --config {path}). Fix: env: {{NAME: 1}}."
            )
        try:
            settings = {
                key: flag_values.yaml_value(actions[key], self.annotations[key], key, value)
                for key, value in config.items()
            }
        except ValueError as error:
            fail(f"{error} (in --config {path})")
        os.environ.update({str(key): str(value) for key, value in env.items()})
        return settings
