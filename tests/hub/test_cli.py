"""The `grpo-hub` command: push and pull through `main([...])`, and the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.conftest import RUN_LIMIT_S
from tests.hub.conftest import ALICE

pytestmark = pytest.mark.hub


def test_parser_registers_the_subcommands():
    from grpo_hub.cli import build_parser

    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert {"push", "pull"} <= set(subparsers.choices)


def test_cli_push_then_pull_merge_round_trip(hub, trained_run, tiny_model_dir, tmp_path, capsys):
    from grpo_hub.cli import main

    checkpoint = trained_run["out"] / "checkpoint-4"
    assert (
        main(["push", str(checkpoint), "alice/cli-run", "--revision", "step-4", "--token", ALICE, "--json"])
        == 0
    )
    pushed = json.loads(capsys.readouterr().out)
    assert pushed["commit_sha"] == hub.repos["alice/cli-run"].branches["step-4"]
    assert "ref/adapter_model.safetensors" not in hub.files("alice/cli-run", "step-4")

    out = tmp_path / "merged"
    argv = [
        "pull",
        "alice/cli-run@step-4",
        "--base-model",
        tiny_model_dir,
        "--merge",
        "--output-dir",
        str(out),
    ]
    assert main([*argv, "--token", ALICE, "--json"]) == 0
    pulled = json.loads(capsys.readouterr().out)
    assert pulled["commit_sha"] == pushed["commit_sha"] and pulled["output_dir"] == str(out)
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()


def test_cli_pull_without_output_dir_only_resolves_and_prints(hub, trained_run, capsys, monkeypatch):
    import transformers

    from grpo_hub.cli import main

    def no_model_load(*args, **kwargs):
        raise AssertionError("pull without --output-dir must not load a model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_model_load)
    sha = hub.repos["alice/tiny-grpo-lora"].branches["step-2"]
    assert main(["pull", "alice/tiny-grpo-lora@step-2", "--token", ALICE]) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith(f"alice/tiny-grpo-lora@step-2 is commit {sha}")
        and "base model:    alice/tiny-qwen2" in out
    )


def test_cli_bare_call_prints_help_and_version(capsys):
    import grpo_hub
    from grpo_hub.cli import main

    assert main([]) == 0 and "space     deploy the comparison Space" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"grpo-hub {grpo_hub.__version__}"


def test_cli_merge_without_output_dir_is_a_usage_error(hub, capsys):
    from grpo_hub.cli import main

    assert main(["pull", "alice/anything", "--merge"]) == 1
    assert "--merge writes a merged model folder. Fix: add --output-dir" in capsys.readouterr().err


def test_console_script_reports_a_rejected_token_and_exits_1(hub, trained_run):
    script = shutil.which("grpo-hub")
    if script is None:
        pytest.fail("the grpo-hub console script is not installed: run `pip install -e .`")
    checkpoint = str(trained_run["out"] / "checkpoint-2")
    done = subprocess.run(
        [script, "push", checkpoint, "alice/cli-bad-token", "--token", "tok-wrong"],
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
        env=dict(os.environ),  # HF_ENDPOINT etc. point at the local Hub (set by the `hub` fixture)
    )
    assert done.returncode == 1, done.stderr
    assert "grpo-hub: error: push to alice/cli-bad-token: the Hub rejected the token" in done.stderr
    assert "alice/cli-bad-token" not in hub.repos
