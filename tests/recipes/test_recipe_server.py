"""The recipe with a local vLLM server (vLLM environment, the shipped chain model): it trains against it with the
token it made and stops the server; Ctrl-C leaves no process of the server's group and no port bound. The recipe joins
a server started by `grpo-hub vllm-serve` (which listens on 127.0.0.1 only), a wrong token is one line, and when that
server dies mid-run, the run stops and its last checkpoint is whole. The first lines say where generation happens and
which weight sync runs; the step lines show staleness and the wait for generation."""

import json
import os
import signal
import subprocess
import time

import pytest

from grpo_hub.generation.server_auth import TOKEN_ENV
from grpo_hub.generation.server_process import group_members
from tests.conftest import REPO_ROOT, RUN_LIMIT_S, free_port
from tests.recipes.helpers import CONFIGS, RECIPE, SMALL_EVAL

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def server_groups(port: int) -> list[int]:
    """Process groups of running vLLM API servers on `port` (read from /proc)."""
    from pathlib import Path

    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in argv and str(port).encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


def listening_addresses(port: int) -> list[str]:
    """The IPv4 addresses a socket listens on at `port` (read from /proc/net/tcp)."""
    from pathlib import Path

    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, local_port = local.split(":")
        if state == "0A" and int(local_port, 16) == port:  # 0A: LISTEN
            found.append(
                ".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0))
            )  # little-endian hex
    return found


def listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_recipe(tmp_path, port: int, *args: str) -> tuple[subprocess.Popen, object]:
    from tests.training.vllm.engine import vllm_env, vllm_python

    out = tmp_path / "out"
    command = [vllm_python(), str(RECIPE), "--config", str(CONFIGS / "chain-async.yaml"), "--vllm_server_port",
               str(port), "--vllm_server_timeout", str(RUN_LIMIT_S), "--output_dir", str(out), *SMALL_EVAL, *args]  # fmt: skip
    log = open(tmp_path / "console.log", "w")  # noqa: SIM115 (closed by the caller's finish)
    env = {name: value for name, value in vllm_env().items() if name != TOKEN_ENV}  # the recipe makes its own
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    return process, out


def wait_for(condition, timeout: float, what: str, tmp_path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}:\n{(tmp_path / 'console.log').read_text()[-3000:]}"
        time.sleep(1)


def test_a_run_trains_against_its_own_server_and_stops_it(tmp_path):
    port = free_port()
    process, out = start_recipe(tmp_path, port, "--max_steps", "4")
    assert process.wait(timeout=RUN_LIMIT_S) == 0, (tmp_path / "console.log").read_text()[-3000:]
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["steps"] == 4 and (out / "adapter_model.safetensors").is_file()
    assert server_groups(port) == [] and not listening(port)
    says_where_generation_happens((tmp_path / "console.log").read_text(), port, "started here on cores 1")


def says_where_generation_happens(console: str, port: int, origin: str) -> None:
    """The run's first lines name the server and the weight sync, its step lines the staleness and the wait."""
    url = f"http://127.0.0.1:{port}"
    assert f"generation: vLLM server at {url} ({origin})" in console, console[-3000:]
    assert (
        "weight sync: merged (auto: a CPU server, where vLLM's LoRA path generates ~3.5x slower)" in console
    )
    assert "asynchronous rollouts: the server generates up to 1 batch(es) ahead (max_staleness=1)" in console
    steps = [line for line in console.splitlines() if line.startswith("step ")]
    assert steps and all("staleness " in line and "generation wait " in line for line in steps), steps
    assert "TRL currently supports vLLM versions" not in console


def test_the_recipe_joins_a_server_started_by_grpo_hub_vllm_serve_and_stops_when_it_dies(tmp_path):
    """The documented server for another node, on this one: `grpo-hub vllm-serve` from the vLLM environment. A run
    with a wrong token, and one that does not name the server's sync folder, stop with one line; a first run joins it
    and trains; a second run joins the same server, which then dies (OOM, a crashed node): the run stops with the
    error and its last checkpoint is whole."""
    from pathlib import Path

    from grpo_hub.generation.server_auth import default_sync_dir
    from grpo_hub.generation.server_process import LocalServer
    from grpo_hub.tasks.chain_model import chain_model_path
    from tests.training.vllm.engine import vllm_env, vllm_python

    port = free_port()
    serve = [str(Path(vllm_python()).parent / "grpo-hub"), "vllm-serve", "--model", chain_model_path(),
             "--port", str(port), "--dtype", "float32"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    sync_dir = str(default_sync_dir(port).resolve())  # the folder the server prints
    named = ("--vllm_server_sync_dir", sync_dir)

    def join(out: Path, *args: str) -> list[str]:
        return [vllm_python(), str(RECIPE), "--config", str(CONFIGS / "chain.yaml"), "--use_vllm", "true",
                "--vllm_mode", "server", "--vllm_server_base_url", url, "--vllm_importance_sampling_mode",
                "token_truncate", "--max_staleness", "1", "--output_dir", str(out), *SMALL_EVAL, *args]  # fmt: skip

    with LocalServer(serve, {**vllm_env(), "OMP_NUM_THREADS": "1"}, tmp_path / "server.log", timeout=RUN_LIMIT_S,
                     cores="1"):  # fmt: skip
        assert server_groups(port)  # the console script became the server (exec): one process group to stop
        assert listening_addresses(port) == ["127.0.0.1"]  # the default bind: this machine only
        wrong = subprocess.run(
            join(tmp_path / "refused", "--max_steps", "1"), cwd=REPO_ROOT, env={**vllm_env(), TOKEN_ENV: "wrong"},
            capture_output=True, text=True, timeout=RUN_LIMIT_S,
        )  # fmt: skip
        assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr[-3000:]
        assert (
            f"grpo.py: error: `{TOKEN_ENV}`: the vLLM server refused GET {url}/v1/models (401 Unauthorized): the "
            f"trainer sent a token the server does not take. Fix: set {TOKEN_ENV}"
        ) in wrong.stderr
        assert '"GET /v1/models HTTP/1.1" 401' in (tmp_path / "server.log").read_text()  # the server's side
        unnamed = subprocess.run(
            join(tmp_path / "unnamed", "--max_steps", "1"), cwd=REPO_ROOT, env=vllm_env(), capture_output=True,
            text=True, timeout=RUN_LIMIT_S,
        )  # fmt: skip
        assert unnamed.returncode == 2 and "Traceback" not in unnamed.stderr, unnamed.stderr[-3000:]
        # issue 65: the trainer writes weights only to a folder it agreed to; the server printed its folder
        refusal = f"grpo.py: error: `vllm_server_sync_dir`: the server names '{sync_dir}' as its sync folder"
        assert refusal in unnamed.stderr and f"set vllm_server_sync_dir='{sync_dir}'" in unnamed.stderr
        assert f"vllm_server_sync_dir='{sync_dir}'" in (tmp_path / "server.log").read_text()
        out = tmp_path / "out"
        done = subprocess.run(
            join(out, "--max_steps", "3", *named), cwd=REPO_ROOT, env=vllm_env(), capture_output=True, text=True,
            timeout=RUN_LIMIT_S,
        )  # fmt: skip
        console = done.stdout + done.stderr
        assert done.returncode == 0, console[-3000:]
        assert "grpo-hub vllm-serve: for trainers with use_vllm=True" in (tmp_path / "server.log").read_text()
        assert json.loads((out / "run_summary.json").read_text())["steps"] == 3
        assert (out / "reward_curve.png").is_file()
        says_where_generation_happens(console, port, "joined: started elsewhere")
        assert server_groups(port) and listening(port)  # a joined server outlives the run

        dying = tmp_path / "dying"
        with open(tmp_path / "console.log", "w") as log:
            process = subprocess.Popen(
                join(dying, "--max_steps", "500", "--save_strategy", "steps", "--save_steps", "2", *named),
                cwd=REPO_ROOT, env=vllm_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        checkpoint = dying / "checkpoint-2"
        wait_for(
            lambda: (checkpoint / "trainer_state.json").is_file(), RUN_LIMIT_S, "no checkpoint", tmp_path
        )
        for pgid in server_groups(port):
            os.killpg(pgid, signal.SIGKILL)  # the server dies
        # the client's retries give up: the run stops with the error
        assert process.wait(timeout=RUN_LIMIT_S) != 0
    saved = json.loads((checkpoint / "trainer_state.json").read_text())
    assert saved["global_step"] == 2
    assert (checkpoint / "adapter_model.safetensors").is_file() and (checkpoint / "batch_stream.pt").is_file()
    assert server_groups(port) == [] and not listening(port)


def test_ctrl_c_leaves_no_server_behind(tmp_path):
    port = free_port()
    process, out = start_recipe(tmp_path, port, "--max_steps", "500")
    wait_for(
        lambda: "step 2/" in (tmp_path / "console.log").read_text(), RUN_LIMIT_S, "no training step", tmp_path
    )
    groups = server_groups(port)
    assert groups and listening(port)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=RUN_LIMIT_S) != 0
    assert all(not group_members(pgid) for pgid in groups) and not listening(port)


def test_a_server_that_is_down_is_one_line_before_training(tmp_path):
    from tests.training.vllm.engine import vllm_env, vllm_python

    url = f"http://127.0.0.1:{free_port()}"
    command = [vllm_python(), str(RECIPE), "--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_base_url",
               url, "--vllm_server_timeout", "1", "--output_dir", str(tmp_path / "out")]  # fmt: skip
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=vllm_env(), capture_output=True, text=True, timeout=RUN_LIMIT_S
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"grpo.py: error: `vllm_server_base_url`: no vLLM server answered at {url}/health" in done.stderr
    assert "Traceback" not in done.stderr and "Fix:" in done.stderr
    assert not (tmp_path / "out" / "run_summary.json").exists()
