"""The local server's life cycle without vLLM: a stand-in server (stand_in_server.py, with a child process as vLLM
has) is started, waited for, and stopped with its whole process group on a normal exit, an exception, Ctrl-C and
SIGTERM to the parent; the port is free again. The argv and environment a real server gets (the real one:
tests/recipes/test_recipe_server.py)."""

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_hub.generation import server_process
from grpo_hub.generation.server import EXTENSION
from grpo_hub.generation.server_auth import MIDDLEWARE, SYNC_DIR_ENV, TOKEN_ENV, TOKEN_FILE_ENV
from tests.conftest import REPO_ROOT, free_port

STAND_IN = Path(__file__).resolve().parent / "stand_in_server.py"


def stand_in(port: int, *flags: str) -> list[str]:
    return [sys.executable, str(STAND_IN), "--host", "127.0.0.1", "--port", str(port), *flags]


def group_alive(pgid: int) -> bool:
    return bool(server_process.group_members(pgid))


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_server_command_has_what_both_syncs_need():
    argv = server_process.server_command("/m", port=8123, dtype="float32", lora_rank=12, python="py")
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    text = " ".join(argv)
    for part in ("--model /m", "--port 8123", "--dtype float32", "--logprobs-mode processed_logprobs",
                 f"--worker-extension-cls {EXTENSION}", "--enable-lora --max-lora-rank 16 --max-loras 1",
                 f"--middleware {MIDDLEWARE}"):  # fmt: skip
        assert part in text, part
    assert "--enable-lora" not in server_process.server_command(
        "/m", port=1, dtype="bfloat16", lora_rank=None
    )


def test_tensor_parallel_size_goes_to_the_server_when_above_one():
    argv = server_process.server_command("/m", port=1, dtype="auto", lora_rank=None, tensor_parallel_size=4)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert "--tensor-parallel-size" not in server_process.server_command(
        "/m", port=1, dtype="auto", lora_rank=None
    )


def test_the_start_says_at_once_where_and_how_long_it_waits_and_is_known_as_started_here(tmp_path, capfd):
    port = free_port()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}
    server = server_process.LocalServer(stand_in(port, "--delay", "0.5"), env, tmp_path / "a.log", timeout=30,
                                        cores=str(min(os.sched_getaffinity(0))))  # fmt: skip
    assert server_process.started_here(server.base_url) is None
    with server:
        core = min(os.sched_getaffinity(0))
        assert server_process.started_here(f"{server.base_url}/") == f"cores {core}, GPUs 1"
    assert server_process.started_here(server.base_url) is None
    assert server_process.own_sync_dir(server.base_url) is None
    assert capfd.readouterr().out.splitlines()[0] == (
        f"starting a vLLM server at http://127.0.0.1:{port} on cores {core}, GPUs 1 (log: {tmp_path / 'a.log'}); "
        "waiting up to 30 s for it to answer /health (vllm_server_timeout)"
    )
    assert server_process.placement(None, {}) == "this machine (no cores or GPUs given)"


def test_the_trainer_takes_the_sync_folder_this_process_gave_its_server_and_no_other(tmp_path):
    """Issue 65: the folder a server names is written to only when this process started that server with it (or the
    user set it): a joined server's folder needs vllm_server_sync_dir."""
    from grpo_hub.generation import vllm_setup

    folder = tmp_path / "sync"
    env = server_process.server_env({TOKEN_ENV: "t"}, cores=None, gpus=None, sync_dir=str(folder))
    served = env[SYNC_DIR_ENV]

    def client(base_url: str):
        return SimpleNamespace(base_url=base_url, post=lambda path, payload: (200, {"results": [served]}))

    with server_process.LocalServer(stand_in(free_port()), env, tmp_path / "a.log", timeout=30) as server:
        assert server_process.own_sync_dir(f"{server.base_url}/") == env[SYNC_DIR_ENV]
        assert vllm_setup.sync_folder_for(client(server.base_url), None, "merged") == folder.resolve()
        another = client(f"http://127.0.0.1:{free_port()}")
        with pytest.raises(ValueError, match="^`vllm_server_sync_dir`: the server names .* this run did not"):
            vllm_setup.sync_folder_for(another, None, "merged")
    # the user's setting; once stopped, another server may hold the port
    assert vllm_setup.sync_folder_for(client(server.base_url), str(folder), "merged") == folder
    with pytest.raises(ValueError, match="which this run did not choose"):
        vllm_setup.sync_folder_for(client(server.base_url), None, "merged")


def test_server_env_turns_on_dev_mode_runtime_lora_and_the_devices():
    env = server_process.server_env({"PATH": "/bin", TOKEN_ENV: "t"}, cores="2-3", gpus="1")
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["OMP_NUM_THREADS"] == "2" and env["CUDA_VISIBLE_DEVICES"] == "1" and env["PATH"] == "/bin"
    kv_cache = server_process.server_env(
        {"VLLM_CPU_KVCACHE_SPACE": "4", TOKEN_ENV: "t"}, cores=None, gpus=None
    )
    assert kv_cache["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_server_env_needs_a_token_and_fixes_an_owner_only_sync_folder(tmp_path):
    with pytest.raises(ValueError, match=f"needs a token. Fix: set {TOKEN_ENV}"):
        server_process.server_env({"PATH": "/bin"}, cores=None, gpus=None)
    given = server_process.server_env({TOKEN_ENV: "t"}, cores=None, gpus=None, sync_dir=str(tmp_path / "s"))
    assert (
        given[SYNC_DIR_ENV] == str((tmp_path / "s").resolve())
        and (tmp_path / "s").stat().st_mode & 0o777 == 0o700
    )
    inherited = server_process.server_env(
        {TOKEN_ENV: "t", SYNC_DIR_ENV: str(tmp_path / "i")}, cores=None, gpus=None
    )
    assert inherited[SYNC_DIR_ENV] == str((tmp_path / "i").resolve())
    fresh = Path(server_process.server_env({TOKEN_ENV: "t"}, cores=None, gpus=None)[SYNC_DIR_ENV])
    assert (
        fresh.is_dir() and fresh.stat().st_mode & 0o777 == 0o700 and fresh.name.startswith("grpo-hub-sync-")
    )


class TokenChecking(http.server.BaseHTTPRequestHandler):
    """A server that, like a grpo_hub one, answers /health to anyone and the rest only with its token."""

    token = None

    def do_GET(self):
        allowed = self.path == "/health" or self.headers.get("Authorization") == f"Bearer {self.token}"
        body = json.dumps({"data": [{"id": "m"}]} if allowed else {"error": "Unauthorized"}).encode()
        self.send_response(200 if allowed else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_local_servers_token_reaches_the_client_but_no_subprocess(monkeypatch, tmp_path):
    """Issue 65: every subprocess of the trainer (a reward function, a tool sandbox running model-written code) inherits
    its environment: the token of the recipe's own server stays out of it and still reaches the trainer's client."""
    from trl.generation import vllm_client, vllm_generation

    from grpo_hub.generation import server, server_auth

    for name in (TOKEN_ENV, TOKEN_FILE_ENV):  # absent, and absent again after the test, whatever set them
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    monkeypatch.setattr(server_auth, "_HELD", {}, raising=False)  # no token held from another test
    local = server_process.local_server("m", port=free_port(), dtype="float32", lora_rank=None, sync="auto",
                                        cores=None, gpus=None, log=tmp_path / "log", timeout=1)  # fmt: skip
    TokenChecking.token = local.env[TOKEN_ENV]  # the server's
    seen = subprocess.run([sys.executable, "-c", f"import os; print(os.environ.get({TOKEN_ENV!r}))"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert seen.stdout.strip() == "None" and TOKEN_ENV not in os.environ
    monkeypatch.setattr(vllm_client, "is_vllm_available", lambda: True)  # TRL's client checks only the import
    stand_in_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TokenChecking)
    threading.Thread(target=stand_in_server.serve_forever, daemon=True).start()
    try:
        with server.http_sync_client("merged"):
            client = vllm_generation.VLLMClient(base_url=f"http://127.0.0.1:{stand_in_server.server_port}")
    finally:
        stand_in_server.shutdown()
    assert client.model == "m"  # TRL's GET /v1/models carried the token


@pytest.mark.parametrize(("cores", "expected"), [("1", {1}), ("0,2", {0, 2}), ("2-3", {2, 3})])
def test_cpu_lists_parse_like_taskset(cores, expected):
    assert server_process.parse_cores(cores) == expected


def test_a_bad_cpu_list_names_the_field():
    with pytest.raises(ValueError, match="^`vllm_server_cores`: 'one' is not a CPU list"):
        server_process.parse_cores("one")


def test_stopped_with_its_group_on_exit_and_on_an_exception(tmp_path):
    port = free_port()
    with server_process.LocalServer(stand_in(port, "--delay", "0.5"), dict(os.environ), tmp_path / "a.log",
                                    timeout=30) as server:  # fmt: skip
        pgid = server.process.pid
        assert listening(port) and server.base_url == f"http://127.0.0.1:{port}"
    assert not group_alive(pgid) and not listening(port)
    port = free_port()
    with pytest.raises(KeyError), server_process.LocalServer(stand_in(port, "--stubborn"), dict(os.environ),
                                                             tmp_path / "b.log", timeout=30) as server:  # fmt: skip
        pgid = server.process.pid
        raise KeyError("training failed")
    assert not group_alive(pgid) and not listening(port)  # SIGTERM ignored: killed after the grace period


def test_a_server_that_exits_or_never_answers_is_one_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="(?s)exited with status 3.*failing on purpose"):
        server_process.LocalServer(stand_in(free_port(), "--exit-at-once"), dict(os.environ), tmp_path / "c.log",
                                   timeout=30).start()  # fmt: skip
    slow = server_process.LocalServer(stand_in(free_port(), "--delay", "30"), dict(os.environ), tmp_path / "d.log",
                                      timeout=1)  # fmt: skip
    with pytest.raises(
        ValueError, match="^`vllm_server_timeout`: the local vLLM server did not answer .* Fix: raise"
    ):
        slow.start()
    assert not group_alive(slow.process.pid)


PARENT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from grpo_hub.generation import server_process
    argv = [sys.executable, {stand_in!r}, "--port", "{port}", "--host", "127.0.0.1"]
    with server_process.LocalServer(argv, dict(os.environ), Path({log!r}), timeout=30) as server:
        Path({pgid!r}).write_text(str(server.process.pid))
        time.sleep(600)  # "training"
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_no_orphan_when_the_parent_is_interrupted_or_terminated(tmp_path, sig):
    port, pgid_file = free_port(), tmp_path / "pgid"
    script = PARENT.format(
        stand_in=str(STAND_IN), port=port, log=str(tmp_path / "e.log"), pgid=str(pgid_file)
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while not pgid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    server_pgid = int(pgid_file.read_text())
    assert group_alive(server_pgid) and listening(port)
    parent.send_signal(sig)  # Ctrl-C, or a scheduler's SIGTERM
    parent.wait(timeout=60)
    assert parent.returncode != 0  # interrupted, not a normal end
    assert not group_alive(server_pgid) and not listening(port)
