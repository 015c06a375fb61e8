"""Who may change a grpo_hub vLLM server: a bearer token on every route but /health, weights only from its sync folder.

vLLM 0.32's `--api-key` guards only the paths under /v1, /v2, /inference and /cohere; the dev-mode and RL routes
(`/collective_rpc`, `/sleep`, `/wake_up`, the weight routes) answer anyone who reaches the port. `TokenMiddleware`,
which vLLM loads through `--middleware`, guards every route but OPEN_PATHS. Server and trainer read the token from the
environment (TOKEN_ENV, or the file TOKEN_FILE_ENV names), never from a command line, which `ps` shows; a process that
starts its own server holds a fresh token in memory (`held_token`), out of the environment its subprocesses inherit.
With the token,
`/collective_rpc` still calls only the worker methods a trainer calls (RPC_METHODS): vLLM's own worker methods would
load weights from any folder (`reload_weights(weights_path=...)`) or kill the engine (`save_sharded_state`).

The worker extension loads weight files only inside the sync folder fixed when the server starts (SYNC_DIR_ENV), after
resolving symlinks and `..` (`inside_sync_folder`), and the middleware holds vLLM's LORA_LOAD_PATH (on with runtime LoRA
updating) to that folder too (`lora_path_inside`); the trainer writes that folder owner-only (`private_folder`).
"""

from __future__ import annotations

import atexit
import hmac
import ipaddress
import json
import os
import secrets
import shutil
import socket
import tempfile
from pathlib import Path

from grpo_hub.errors import field_error

TOKEN_ENV = "GRPO_HUB_VLLM_TOKEN"
TOKEN_FILE_ENV = "GRPO_HUB_VLLM_TOKEN_FILE"
SYNC_DIR_ENV = "GRPO_HUB_VLLM_SYNC_DIR"
MIDDLEWARE = "grpo_hub.generation.server_auth.TokenMiddleware"
CACHE = Path.home() / ".cache" / "grpo_hub"
_HELD: dict[str, str] = {}  # the token of a server this process started (`held_token`), in memory only
# what a load balancer or the trainer's wait for the server may ask unannounced
OPEN_PATHS = frozenset({"/health"})
RPC_PATH = "/collective_rpc"
LORA_LOAD_PATH = "/v1/load_lora_adapter"  # vLLM loads the adapter folder its body's `lora_path` names
# the worker methods a trainer calls through RPC_PATH: grpo_hub's worker extension's (TRL 1.16's client calls none: its
# NCCL sync has routes of its own, /init_weight_transfer_engine and /update_weights)
RPC_METHODS = frozenset(
    (
        "grpo_hub_extension_version",
        "grpo_hub_sync_dir",
        "grpo_hub_reload_weights",
        "grpo_hub_reload_checkpoint",
    )
)
TOKEN_FIX = (
    f"set {TOKEN_ENV} (or {TOKEN_FILE_ENV}, a file holding it) in the trainer's environment to the token the server "
    "was started with"
)


def new_token() -> str:
    """A fresh random token (256 bits)."""
    return secrets.token_urlsafe(32)


def read_token(env=os.environ) -> str | None:
    """The token in `env`: TOKEN_ENV's value, else the content of the file TOKEN_FILE_ENV names; None when neither
    is set. A named file that is missing or empty is an error naming the variable."""
    if env.get(TOKEN_ENV):
        return env[TOKEN_ENV]
    path = env.get(TOKEN_FILE_ENV)
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as error:
        field_error(
            TOKEN_FILE_ENV,
            f"cannot read the token file {path!r} ({error.strerror}).",
            "name a readable file.",
        )
    if not token:
        field_error(TOKEN_FILE_ENV, f"the token file {path!r} is empty.", "write the server's token into it.")
    return token


def held_token() -> str:
    """The token of a server this process starts and trains against: the environment's (`read_token`), else a fresh
    one held in this process's memory (`client_token`), never put into the environment, which every subprocess (a
    reward function, a tool sandbox running model-written code) inherits."""
    token = client_token()
    if token is None:
        token = _HELD["token"] = new_token()
    return token


def client_token() -> str | None:
    """The token this process's clients send: the environment's (`read_token`), else the one `held_token` holds."""
    return read_token() or _HELD.get("token")


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) is this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except OSError:
            return False


def loopback_token_file(host: str, port: int) -> Path:
    """For a server bound to this machine only: a fresh token in an owner-only file under CACHE (returned). Another
    address without a token set is refused: anyone on that network could then reach the server."""
    if not is_loopback(host):
        field_error(
            "--host",
            f"{host} takes requests from the network, and no token is set.",
            f"set {TOKEN_ENV} (or {TOKEN_FILE_ENV}) here and in the trainer's environment, or bind 127.0.0.1.",
        )
    path = private_folder(CACHE) / f"vllm-token-{port}"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(new_token())
    return path


def default_sync_dir(port: int) -> Path:
    """`grpo-hub vllm-serve`'s sync folder when none is given."""
    return CACHE / f"vllm-sync-{port}"


def auth_headers(token: str | None) -> dict[str, str]:
    """The request headers that carry `token` (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def authorized(headers: list[tuple[bytes, bytes]], token: str) -> bool:
    """Whether ASGI `headers` carry `Authorization: Bearer <token>` (compared in constant time)."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, given = value.decode("latin-1").partition(" ")
            return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode())
    return False


class TokenMiddleware:
    """ASGI middleware: a request to any path but OPEN_PATHS without the server's token gets 401 and reaches no route;
    one to RPC_PATH with the token but a worker method outside RPC_METHODS gets 403, and so does one to LORA_LOAD_PATH
    whose `lora_path` is not inside the server's sync folder (SYNC_DIR_ENV). The token is read from the server's
    environment when vLLM builds its app; a server started without one fails."""

    def __init__(self, app):
        token = read_token()
        if token is None:
            raise RuntimeError(
                f"{MIDDLEWARE} needs a token: set {TOKEN_ENV} or {TOKEN_FILE_ENV} in the server's environment."
            )
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        guarded = scope["type"] in ("http", "websocket") and scope["path"] not in OPEN_PATHS
        if guarded and not authorized(scope.get("headers", []), self.token):
            await refuse(scope, send)
            return
        if scope["type"] == "http" and scope["path"].endswith(RPC_PATH):  # behind vLLM's --root-path too
            body, receive = await read_body(receive)
            method = rpc_method(body)
            if not (isinstance(method, str) and method in RPC_METHODS):
                allowed = ", ".join(sorted(RPC_METHODS))
                await forbid(
                    send,
                    f"{RPC_PATH} calls only the worker methods a trainer calls ({allowed}), not method {method!r}",
                )
                return
        if scope["type"] == "http" and scope["path"].endswith(LORA_LOAD_PATH):
            body, receive = await read_body(receive)
            try:
                lora_path_inside(body, os.environ.get(SYNC_DIR_ENV))
            except PermissionError as error:
                await forbid(send, f"{LORA_LOAD_PATH} {error}")
                return
        await self.app(scope, receive, send)


async def read_body(receive):
    """(the whole request body, a `receive` that hands it to the app again)."""
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message["type"] == "http.request" and message.get("more_body", False)
    body, replayed = b"".join(chunks), []

    async def replay():
        if replayed:
            return await receive()
        replayed.append(True)
        return {"type": "http.request", "body": body, "more_body": False}

    return body, replay


def request_field(body: bytes, name: str):
    """Field `name` of a JSON request body, parsed as vLLM's routes parse it (`json.loads`: of duplicate keys the last
    counts); None when the body is not a JSON object or has no such field."""
    try:
        request = json.loads(body)
    except ValueError:  # not JSON, or not text
        return None
    return request.get(name) if isinstance(request, dict) else None


def rpc_method(body: bytes):
    """The worker method an RPC_PATH body names (`request_field`); None when it names none."""
    return request_field(body, "method")


def lora_path_inside(body: bytes, sync_dir: str | None) -> Path:
    """The `lora_path` of a LORA_LOAD_PATH body, resolved, when it is an absolute path inside `sync_dir`
    (`inside_sync_folder`); else PermissionError naming it and the folder. A relative path is refused: vLLM 0.32 reads
    it by rules of its own (`~` expanded; a path that is not there, a Hugging Face Hub repo to download:
    vllm/lora/utils.py `get_adapter_absolute_path`), not as `inside_sync_folder` resolves it."""
    path = request_field(body, "lora_path")
    if not isinstance(path, str) or not os.path.isabs(path):
        folder = Path(sync_dir).resolve() if sync_dir else f"its sync folder ({SYNC_DIR_ENV}, not set)"
        raise PermissionError(
            f"refused to load {path!r}: not an absolute path; this vLLM server loads weights only from {folder}"
        )
    return inside_sync_folder(path, sync_dir)


async def forbid(send, error: str) -> None:
    """Answer 403 with `error` (what was refused, and what this server takes)."""
    body = json.dumps({"error": f"Forbidden: {error}"}).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def refuse(scope, send) -> None:
    """Answer 401 (an HTTP request) or close (a websocket) without calling the app."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps({"error": "Unauthorized: this grpo_hub vLLM server needs its bearer token"}).encode()
    headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def private_folder(path: str | Path) -> Path:
    """`path` created if needed and made owner-only (0700): no other user reads or plants a sync there."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def temporary_sync_folder() -> str:
    """A fresh owner-only folder under the system's temporary folder, removed when this process exits."""
    folder = tempfile.mkdtemp(prefix="grpo-hub-sync-")  # 0700
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def inside_sync_folder(path: str, sync_dir: str | None) -> Path:
    """`path` resolved (symlinks, `..`) when it lies inside `sync_dir` (resolved too); else PermissionError."""
    if not sync_dir:
        raise PermissionError(
            f"this vLLM server loads weights only from its sync folder, and it was started without one ({SYNC_DIR_ENV})"
        )
    folder, target = Path(sync_dir).resolve(), Path(path).resolve()
    if not target.is_relative_to(folder) or target == folder:
        raise PermissionError(f"refused to load {path!r}: this vLLM server loads weights only from {folder}")
    return target
