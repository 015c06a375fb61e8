"""Scaffolding of the recipe tests: recipes/grpo.py imported or launched, its presets read."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from grpo_hub.config.config_files import read_config
from tests.conftest import REPO_ROOT, free_port
from tests.training.distributed.launch import launch_env, run_isolated

RECIPE = REPO_ROOT / "recipes" / "grpo.py"
CONFIGS = REPO_ROOT / "recipes" / "configs"
# For runs that check plumbing, not accuracy: held-out accuracy on 20 problems per level (80 for chain) instead of the
# task's whole set (2,000 for chain: ~25 s of a short run, twice that under DeepSpeed)
SMALL_EVAL = ("--eval_per_level", "20")


def preset(name: str) -> dict:
    """The settings of `recipes/configs/<name>`, merged over its `base:` parent."""
    return read_config(CONFIGS / name)


def load_recipe():
    """Import recipes/grpo.py as a module (recipes/ is not a package)."""
    spec = importlib.util.spec_from_file_location("grpo_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def parse(recipe, *argv):
    return recipe.make_parser(list(argv)).parse_args_and_config(list(argv))


def one_line_error(recipe, capsys, *argv) -> str:
    """The parser's answer to a bad input: exit status 2 and exactly one line on stderr, returned."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        parse(recipe, *argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


def launch(tmp_path, *args, accelerate_config=None, env=None):
    """`accelerate launch recipes/grpo.py ARGS --output_dir tmp/out` (`env` overrides `launch_env()`, a None value
    unsets the variable); return (summary dict, output dir). The console output is kept in tmp/console.log."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(free_port())]
    if accelerate_config:
        config = Path(accelerate_config)
        config = config if config.is_absolute() else REPO_ROOT / "recipes" / "accelerate" / config
        command += ["--config_file", str(config)]
    else:
        command += ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no"]
    command += [str(RECIPE), *args, "--output_dir", str(out)]
    env = {name: value for name, value in {**launch_env(), **(env or {})}.items() if value is not None}
    console = run_isolated(command, tmp_path, env, "recipe run")
    (tmp_path / "console.log").write_text(console)
    assert "GRPO done:" in console
    return json.loads((out / "run_summary.json").read_text()), out
