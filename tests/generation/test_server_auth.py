"""grpo_hub.generation.server_auth (the token guard and the sync folder) and the trainer's side of it in
generation/server.py, against naive checks. The real server: tests/training/vllm/test_vllm_server_auth.py."""

import asyncio
import itertools
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_hub.generation import server, server_auth
from grpo_hub.generation.server_auth import TOKEN_ENV, TOKEN_FILE_ENV, TokenMiddleware

TOKEN = "right-token"
PATHS = ["/health", "/collective_rpc", "/sleep", "/wake_up", "/v1/completions", "/v1/models", "/update_weights",
         "/healthz", "/health/", "/", "/docs", "/server_info"]  # fmt: skip
HEADERS = [None, "Bearer right-token", "bearer right-token", "Bearer wrong-token", "Basic right-token",
           "Bearer right-token ", "Bearer ", "right-token"]  # fmt: skip


def naive_allowed(path: str, header: str | None) -> bool:
    """Let through /health, and any other path only with exactly 'Bearer <token>' (scheme in any case)."""
    if path == "/health":
        return True
    if header is None or " " not in header:
        return False
    scheme, value = header.split(" ", 1)
    return scheme.lower() == "bearer" and value == TOKEN


def call(middleware, scope) -> tuple[bool, list[dict]]:
    """(whether the app was reached, the messages the middleware itself sent)."""
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():  # a body /collective_rpc takes
        return {"type": "http.request", "body": b'{"method": "grpo_hub_sync_dir"}'}

    asyncio.run(middleware(scope, receive, send))
    return scope.get("reached", False), sent


async def app(scope, receive, send):
    scope["reached"] = True


@pytest.fixture
def guard(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    return TokenMiddleware(app)


@pytest.mark.parametrize(("path", "header"), list(itertools.product(PATHS, HEADERS)))
def test_only_health_or_the_right_bearer_token_reaches_the_app(guard, path, header):
    headers = [(b"authorization", header.encode())] if header is not None else []
    for kind in ("http", "websocket"):
        reached, sent = call(guard, {"type": kind, "path": path, "method": "POST", "headers": headers})
        assert reached == naive_allowed(path, header), (kind, path, header)
        if not reached and kind == "http":
            assert sent[0]["status"] == 401 and b"bearer token" in sent[1]["body"]
        if not reached and kind == "websocket":
            assert sent == [{"type": "websocket.close", "code": 1008}]
    assert call(guard, {"type": "lifespan"})[0]  # start-up and shut-down are not requests


async def reading_app(scope, receive, send):
    """An app that reads the whole request body, as vLLM's /collective_rpc route does."""
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    scope["reached"] = body


def rpc(body: bytes, path: str = "/collective_rpc", root_path: str = "") -> tuple[bytes | None, list[dict]]:
    """(the body the app read, None when it was not reached; what the middleware sent) of a POST carrying the token
    and `body` in two chunks."""
    os.environ[TOKEN_ENV] = TOKEN  # the fixture's monkeypatch undoes it
    guard, sent = TokenMiddleware(reading_app), []
    chunks = [{"type": "http.request", "body": body[:5], "more_body": True},
              {"type": "http.request", "body": body[5:], "more_body": False}]  # fmt: skip

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "root_path": root_path, "method": "POST",
             "headers": [(b"authorization", f"Bearer {TOKEN}".encode())]}  # fmt: skip
    asyncio.run(guard(scope, receive, send))
    return scope.get("reached"), sent


def test_collective_rpc_takes_only_the_worker_methods_a_trainer_calls(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    for method in sorted(server_auth.RPC_METHODS):
        body = json.dumps({"method": method, "args": ["/x/weights.safetensors"]}).encode()
        assert rpc(body) == (body, []), method  # the app reads the body it was sent, whole
    refused = [
        ({"method": "reload_weights", "kwargs": {"weights_path": "/elsewhere"}}, "'reload_weights'"),
        ({"method": "save_sharded_state", "kwargs": {"path": "/tmp/x"}}, "'save_sharded_state'"),
        ({"method": "grpo_hub_reload_weights_", "args": []}, "'grpo_hub_reload_weights_'"),
        ({"method": ["grpo_hub_sync_dir"]}, "['grpo_hub_sync_dir']"),
        ({"args": ["x"]}, "None"),
        (["grpo_hub_sync_dir"], "None"),
    ]
    bodies = [(json.dumps(request).encode(), named) for request, named in refused]
    bodies += [(b'{"method": "grpo_hub_sync_dir", "method": "reload_weights"}', "'reload_weights'"),  # vLLM reads the last
               (b"not json", "None"), (b"", "None"), (b"\xff\xfe", "None")]  # fmt: skip
    for body, named in bodies:
        for path, root_path in (("/collective_rpc", ""), ("/api/collective_rpc", "/api")):
            reached, sent = rpc(body, path, root_path)
            assert reached is None and sent[0]["status"] == 403, (body, path)
            answer = json.loads(sent[1]["body"])["error"]
            assert f"method {named}" in answer and "grpo_hub_reload_weights, " in answer, answer


def test_a_lora_adapter_loads_only_from_inside_the_sync_folder(tmp_path, monkeypatch):
    """Issue 73: vLLM's /v1/load_lora_adapter (runtime LoRA updating, which `grpo-hub vllm-serve` turns on) reads the
    folder its `lora_path` names; the middleware lets through only an absolute path inside the sync folder, after
    resolving symlinks and `..`, and refuses any other with 403 naming the path and the folder."""
    folder, outside = tmp_path / "sync", tmp_path / "other"
    for made in (folder / "adapter-1", folder / "sub", outside / "evil"):
        made.mkdir(parents=True)
    (folder / "link").symlink_to(outside / "evil")
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(server_auth.SYNC_DIR_ENV, str(folder))
    monkeypatch.chdir(folder)  # a relative path is refused even where it would resolve inside
    for inside in (folder / "adapter-1", folder / "sub" / ".." / "adapter-1", folder / "not-yet-written"):
        body = json.dumps({"lora_name": "a", "lora_path": str(inside)}).encode()
        for path, root_path in (("/v1/load_lora_adapter", ""), ("/api/v1/load_lora_adapter", "/api")):
            assert rpc(body, path, root_path) == (body, []), (
                inside
            )  # the app reads the body it was sent, whole
    escapes = [str(outside / "evil"), str(folder / ".." / "other" / "evil"), str(folder / "link"), str(folder),
               "/etc", "adapter-1", "./adapter-1", "~/adapter", "someone/lora-on-the-hub", "", None, ["/x"]]  # fmt: skip
    bodies = [(json.dumps({"lora_name": "a", "lora_path": path}).encode(), path) for path in escapes]
    bodies += [(json.dumps({"lora_name": "a"}).encode(), None), (b"not json", None), (b"", None),
               (b'{"lora_path": "%s", "lora_path": "/etc"}' % str(folder / "adapter-1").encode(), "/etc")]  # fmt: skip
    for body, named in bodies:
        for path, root_path in (("/v1/load_lora_adapter", ""), ("/api/v1/load_lora_adapter", "/api")):
            reached, sent = rpc(body, path, root_path)
            assert reached is None and sent[0]["status"] == 403, (body, path)
            answer = json.loads(sent[1]["body"])["error"]
            assert f"refused to load {named!r}" in answer, answer
            assert f"loads weights only from {folder.resolve()}" in answer, answer
    monkeypatch.delenv(server_auth.SYNC_DIR_ENV)
    body = json.dumps({"lora_name": "a", "lora_path": str(folder / "adapter-1")}).encode()
    reached, sent = rpc(body, "/v1/load_lora_adapter")
    assert reached is None and sent[0]["status"] == 403 and b"started without one" in sent[1]["body"]


def test_the_trainers_adapter_sync_and_its_probe_pass_the_guard(tmp_path, monkeypatch):
    """What grpo_hub's own 'adapter' sync posts to /v1/load_lora_adapter (`ServerAdapterSync`, a fresh folder under the
    sync folder) and the probe of the route before training (a missing adapter inside the sync folder) reach vLLM."""
    folder = tmp_path / "sync"
    folder.mkdir()
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(server_auth.SYNC_DIR_ENV, str(folder))
    reached = []

    def post(path, payload):
        """The guarded server: /collective_rpc names the sync folder; other routes record what reached them."""
        if path == "/collective_rpc":
            return 200, {"results": [str(folder.resolve())]}
        body = json.dumps(payload).encode()
        got, sent = rpc(body, path)
        if got is None:
            return sent[0]["status"], json.loads(sent[1]["body"])
        reached.append((path, json.loads(got)["lora_path"]))
        return 200, {}

    status, body = server.lora_route_probe(post)
    assert status == 200 and reached == [
        ("/v1/load_lora_adapter", str(folder.resolve() / "grpo-hub-probe-absent"))
    ]
    client = SimpleNamespace(post=post, call=lambda path, payload: post(path, payload)[1], model=None)
    model = SimpleNamespace(peft_config={"default": SimpleNamespace(to_dict=dict, target_modules={"q_proj"})})
    sync = server.ServerAdapterSync(client, folder, True, model=model, adapter="default", gather_params=None)
    sync.send({})
    (loaded,) = reached[1:]
    assert (
        loaded[0] == "/v1/load_lora_adapter" and Path(loaded[1]).parent == folder and Path(loaded[1]).is_dir()
    )


def test_the_allow_list_is_the_worker_extensions_methods():
    from grpo_hub.generation.worker_extension import WorkerExtension

    methods = {name for name in vars(WorkerExtension) if not name.startswith("_")}
    called = {server.RELOAD_METHOD, server.VERSION_METHOD, server.CHECKPOINT_METHOD, server.SYNC_DIR_METHOD}
    assert methods == called == server_auth.RPC_METHODS


def test_a_server_without_a_token_does_not_start(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    with pytest.raises(RuntimeError, match=f"needs a token: set {TOKEN_ENV}"):
        TokenMiddleware(app)


def test_the_token_comes_from_the_variable_else_the_file_it_names(tmp_path):
    file = tmp_path / "token"
    file.write_text("from-file\n")
    assert server_auth.read_token({TOKEN_ENV: "direct", TOKEN_FILE_ENV: str(file)}) == "direct"
    assert server_auth.read_token({TOKEN_FILE_ENV: str(file)}) == "from-file"
    assert server_auth.read_token({}) is None
    with pytest.raises(ValueError, match=f"`{TOKEN_FILE_ENV}`: cannot read the token file"):
        server_auth.read_token({TOKEN_FILE_ENV: str(tmp_path / "missing")})
    (tmp_path / "empty").write_text(" \n")
    with pytest.raises(ValueError, match=f"`{TOKEN_FILE_ENV}`: the token file .* is empty"):
        server_auth.read_token({TOKEN_FILE_ENV: str(tmp_path / "empty")})


def test_a_held_token_is_the_environments_else_a_fresh_one_kept_out_of_the_environment(monkeypatch):
    monkeypatch.setattr(server_auth, "_HELD", {})
    monkeypatch.setenv(TOKEN_ENV, "kept")
    assert server_auth.held_token() == "kept" == server_auth.client_token()
    monkeypatch.setattr(server_auth, "_HELD", {})
    monkeypatch.delenv(TOKEN_ENV)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    assert server_auth.client_token() is None
    token = server_auth.held_token()
    assert len(token) >= 40 and server_auth.held_token() == token == server_auth.client_token()
    assert TOKEN_ENV not in os.environ and token not in os.environ.values()
    assert (
        server_auth.auth_headers(token) == {"Authorization": f"Bearer {token}"}
        and server_auth.auth_headers(None) == {}
    )


def test_a_loopback_bind_gets_an_owner_only_token_file_and_another_address_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(server_auth, "CACHE", tmp_path)
    for host in ("127.0.0.1", "localhost", "::1"):
        assert server_auth.is_loopback(host)
    for host in ("0.0.0.0", "::", "10.1.2.3", "no-such-host.invalid"):
        assert not server_auth.is_loopback(host)
    path = server_auth.loopback_token_file("127.0.0.1", 8000)
    assert path.stat().st_mode & 0o777 == 0o600 and len(path.read_text()) >= 40
    with pytest.raises(
        ValueError, match="`--host`: 0.0.0.0 takes requests from the network, and no token is set"
    ):
        server_auth.loopback_token_file("0.0.0.0", 8000)


def test_only_a_file_inside_the_sync_folder_loads(tmp_path):
    folder, outside = tmp_path / "sync", tmp_path / "other"
    folder.mkdir()
    outside.mkdir()
    (folder / "weights.safetensors").touch()
    (outside / "evil.safetensors").touch()
    (folder / "link.safetensors").symlink_to(outside / "evil.safetensors")
    (folder / "sub").mkdir()
    assert (
        server_auth.inside_sync_folder(str(folder / "weights.safetensors"), str(folder))
        == (folder / "weights.safetensors").resolve()
    )
    assert server_auth.inside_sync_folder(str(folder / "sub" / ".." / "weights.safetensors"), str(folder))
    for path in (outside / "evil.safetensors", folder / ".." / "other" / "evil.safetensors",
                 folder / "link.safetensors", folder, "/etc/passwd", "relative.safetensors"):  # fmt: skip
        with pytest.raises(PermissionError, match="loads weights only from"):
            server_auth.inside_sync_folder(str(path), str(folder))
    with pytest.raises(PermissionError, match="started without one"):
        server_auth.inside_sync_folder(str(folder / "weights.safetensors"), None)


def test_the_trainer_writes_only_to_a_sync_folder_it_agreed_to(tmp_path):
    """Issue 65: a server that is not this run's, or anyone in the middle of plain HTTP, names the folder the trainer
    would make owner-only and fill with weights: it is taken only as the folder the user set (vllm_server_sync_dir) or
    the one this process gave a server it started (`own`)."""
    served, elsewhere = tmp_path / "served", tmp_path / "elsewhere"
    served.mkdir()
    served.chmod(0o755)
    for named in (served, elsewhere):
        with pytest.raises(ValueError) as refused:
            server.sync_folder(None, str(named))
        assert str(refused.value).startswith(
            f"`vllm_server_sync_dir`: the server names {str(named)!r} as its sync folder, which this run did not "
            "choose"
        )
        assert f"Fix: if that server is yours, set vllm_server_sync_dir={str(named)!r}" in str(refused.value)
    assert served.stat().st_mode & 0o777 == 0o755 and not elsewhere.exists()  # untouched
    assert server.sync_folder(str(served), str(served)) == served and served.stat().st_mode & 0o777 == 0o700
    dotted = tmp_path / "x" / ".." / "served"
    assert server.sync_folder(str(dotted), str(served.resolve())) == dotted
    own = tmp_path / "own"
    assert server.sync_folder(None, str(own), own=str(own)) == own and own.stat().st_mode & 0o777 == 0o700
    with pytest.raises(
        ValueError, match=r"`vllm_server_sync_dir`: .* loads weights only from its sync folder .* --sync-dir"
    ):
        server.sync_folder(str(tmp_path / "mine"), str(served))
    with pytest.raises(ValueError, match=r"`vllm_server_sync_dir`: .* loads weights only from its sync"):
        server.sync_folder(None, str(served), own=str(own))
    # a server without a folder of its own: the adapter sync
    mine = server.sync_folder(str(tmp_path / "mine"), None)
    assert mine.stat().st_mode & 0o777 == 0o700
    temporary = server.sync_folder(None, None)
    assert temporary.is_dir() and temporary.stat().st_mode & 0o777 == 0o700


def test_every_sync_is_written_owner_only(tmp_path):
    def folder(staging):
        staging.mkdir()
        (staging / "adapter_model.safetensors").write_text("x")

    server.write_atomically(tmp_path / "adapter", folder)
    server.write_atomically(tmp_path / "weights.safetensors", lambda staging: staging.write_text("x"))
    assert (tmp_path / "adapter").stat().st_mode & 0o777 == 0o700
    for path in (tmp_path / "adapter" / "adapter_model.safetensors", tmp_path / "weights.safetensors"):
        assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path)) == ["adapter", "weights.safetensors"]


def test_a_refused_request_is_one_line_naming_the_token_setting():
    request = SimpleNamespace(method="POST")
    server.check_authorized(SimpleNamespace(status_code=200, request=request, url="u"), None)
    for token, said in ((None, "sent no token"), ("t", "sent a token the server does not take")):
        with pytest.raises(ValueError) as refused:
            server.check_authorized(
                SimpleNamespace(status_code=401, request=request, url="http://h/x"), token
            )
        message = str(refused.value)
        assert message.startswith(
            f"`{TOKEN_ENV}`: the vLLM server refused POST http://h/x (401 Unauthorized)"
        )
        assert (
            said in message
            and f"Fix: set {TOKEN_ENV} (or {TOKEN_FILE_ENV}" in message
            and "\n" not in message
        )
