"""A small local server speaking the Hugging Face Hub HTTP API, for testing the real `huggingface_hub` client.

Serves models and Spaces from memory (see `fake_hub_store`; a Space is stored under the key
"spaces/owner/name"). Endpoints: whoami-v2, repos/create, validate-yaml, repo info (optionally at a
revision), tree, refs, preupload, commit (NDJSON), branch create/delete, tag, LFS batch + PUT, HEAD/GET
`resolve`, and a Space's variables (GET/POST/DELETE /api/spaces/{repo}/variables, as `HfApi.*_space_variable`
calls them). Errors carry the Hub's `X-Error-Code` / `X-Error-Message` headers
so the client raises its usual exceptions. Auth: `Authorization: Bearer <token>` with tokens given at
construction; an unknown token is a 401, a private repo is invisible (404) to other users, and only the
owner may write (403). Binds 127.0.0.1 on a free port; `with` it (its serving thread is a daemon: it never outlives
the test process), so that no time limit can stop it under a slow test.

`drop_next(route)` makes the server cut the connection on the next request to `route` after reading half
of its body: a network failure mid-upload. `requests` logs `(method, route)` of every request.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

import yaml

from tests.hub.fake_hub_store import HubStoreError, Repo, apply_operations, is_lfs_path, new_repo

INVALID_TOKEN = "Invalid credentials in Authorization header"
MAX_BODY = 64 * 1024 * 1024  # bytes; tests push tiny adapters


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


SPACE_SDKS = ("gradio", "docker", "static")


def validate_card_yaml(content: str, repo_type: str = "model") -> list[str]:
    """Errors in a README's YAML front matter, checked the way the Hub checks the keys we care about."""
    if not content.startswith("---\n") or "\n---" not in content[3:]:
        return []
    try:
        meta = yaml.safe_load(content[4 : content.index("\n---", 3)])
    except yaml.YAMLError as err:
        return [f"invalid YAML: {err}"]
    if meta is None:
        return []
    if not isinstance(meta, dict):
        return ["metadata must be a YAML mapping"]
    errors = []
    for key in ("library_name", "license", "pipeline_tag"):
        if key in meta and not isinstance(meta[key], str):
            errors.append(f'"{key}" must be a string')
    for key in ("tags", "datasets", "language"):
        if key in meta and not (isinstance(meta[key], list) and all(isinstance(t, str) for t in meta[key])):
            errors.append(f'"{key}" must be a list of strings')
    base = meta.get("base_model")
    if base is not None and not (
        isinstance(base, str) or (isinstance(base, list) and all(isinstance(b, str) for b in base))
    ):
        errors.append('"base_model" must be a string or a list of strings')
    if repo_type == "space":
        if meta.get("sdk") not in SPACE_SDKS:
            errors.append(f'"sdk" must be one of {list(SPACE_SDKS)}')
        for key in ("title", "app_file", "sdk_version", "short_description"):
            if key in meta and not isinstance(meta[key], str):
                errors.append(f'"{key}" must be a string')
        if len(str(meta.get("short_description", ""))) > 60:
            errors.append('"short_description" must be at most 60 characters')
    return errors


class FakeHub:
    """The server and its state. `tokens` maps access token -> user name."""

    def __init__(self, tokens: dict[str, str]):
        self.tokens = dict(tokens)
        self.repos: dict[str, Repo] = {}  # model "owner/name", Space "spaces/owner/name"
        self.variables: dict[str, dict[str, dict]] = {}  # Space key -> variable name -> {value, ...}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.RLock()
        self._drops: dict[str, int] = {}
        self._upload_keys: dict[str, str] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def drop_next(self, route: str, times: int = 1) -> None:
        """Cut the connection mid-body on the next `times` requests to `route` (e.g. "commit", "lfs_put")."""
        with self.lock:
            self._drops[route] = self._drops.get(route, 0) + times

    def take_drop(self, route: str) -> bool:
        with self.lock:
            if self._drops.get(route, 0) > 0:
                self._drops[route] -= 1
                return True
            return False

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        """Snapshot of a repo at a revision (test helper)."""
        key = f"spaces/{repo_id}" if repo_type == "space" else repo_id
        with self.lock:
            return dict(self.repos[key].resolve(revision).files)

    # ---- request handling -------------------------------------------------------------------------

    def user_for(self, authorization: str | None) -> str | None:
        if not authorization:
            return None
        token = authorization.removeprefix("Bearer ").strip()
        if token not in self.tokens:
            raise HubStoreError(401, INVALID_TOKEN)
        return self.tokens[token]

    def readable(self, repo_id: str, user: str | None) -> Repo:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and user != repo.owner):
            raise HubStoreError(404, "Repository not found", "RepoNotFound")
        return repo

    def writable(self, repo_id: str, user: str | None) -> Repo:
        repo = self.readable(repo_id, user)
        if user != repo.owner:
            raise HubStoreError(403, f"You don't have the rights to write to {repo_id}")
        return repo

    def create_repo(self, body: dict, user: str | None) -> tuple[int, dict]:
        if user is None:
            raise HubStoreError(401, "You must be authenticated to create a repo")
        namespace = body.get("organization") or user
        if namespace != user:
            raise HubStoreError(
                403, f"You don't have the rights to create a model under the namespace {namespace}"
            )
        kind = body.get("type", "model")
        if kind not in ("model", "space"):
            raise HubStoreError(400, "This test server hosts models and Spaces only")
        if kind == "space" and body.get("sdk") not in SPACE_SDKS:
            raise HubStoreError(400, f"sdk must be one of {list(SPACE_SDKS)}")
        key = f"spaces/{namespace}/{body['name']}" if kind == "space" else f"{namespace}/{body['name']}"
        url = f"{self.url}/{key}"
        if key in self.repos:
            raise HubStoreError(409, f"You already created this {kind} repo", url=url)
        private = body.get("visibility") == "private" or bool(body.get("private"))
        self.repos[key] = new_repo(key, user, private)
        if kind == "space":
            self.variables[key] = {}
        return 200, {"url": url, "name": key.removeprefix("spaces/")}

    def model_info(self, repo: Repo, revision: str) -> dict:
        commit = repo.resolve(revision)
        repo_id = repo.repo_id.removeprefix("spaces/")
        return {
            "id": repo_id,
            "modelId": repo_id,
            "author": repo.owner,
            "sha": commit.oid,
            "private": repo.private,
            "disabled": False,
            "gated": False,
            "lastModified": _iso(commit.date),
            "tags": [],
            "siblings": [{"rfilename": p} for p in sorted(commit.files)],
        }

    def tree(self, repo: Repo, revision: str, path: str, recursive: bool) -> list[dict]:
        files = repo.resolve(revision).files
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        entries: dict[str, dict] = {}
        for name in sorted(p for p in files if p.startswith(prefix)):
            parts = name[len(prefix) :].split("/")
            depth = len(parts) if recursive else 1
            for i in range(1, min(depth, len(parts) - 1) + 1):
                folder = prefix + "/".join(parts[:i])
                entries.setdefault(folder, {"type": "directory", "path": folder, "size": 0, "oid": "0" * 40})
            if recursive or len(parts) == 1:
                entries[name] = repo.entry(name, files[name])
        if not entries and prefix:
            raise HubStoreError(404, f"{path} does not exist at {revision}", "EntryNotFound")
        return list(entries.values())

    def preupload(self, repo: Repo, revision: str, body: dict) -> dict:
        files = repo.resolve(revision).files
        out = []
        for item in body.get("files", []):
            path, lfs = item["path"], is_lfs_path(item["path"], int(item["size"]))
            current = files.get(path)
            oid = None
            if current is not None:
                oid = hashlib.sha256(current).hexdigest() if lfs else repo.entry(path, current)["oid"]
            out.append(
                {"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
            )
        return {"files": out, "commitOid": repo.resolve(revision).oid}

    def commit(self, repo: Repo, branch: str, lines: list[dict]) -> dict:
        if branch not in repo.branches:
            raise HubStoreError(404, f"Invalid rev id: {branch} (commits go to a branch)", "RevisionNotFound")
        if not lines or lines[0].get("key") != "header":
            raise HubStoreError(400, "The first NDJSON line must be the commit header")
        header = lines[0]["value"]
        head = repo.resolve(branch)
        if header.get("parentCommit") not in (None, head.oid):
            raise HubStoreError(412, f"Parent commit {header['parentCommit']} is not the head of {branch}")
        files = apply_operations(repo, head, lines[1:])
        commit = repo.add_commit(branch, header.get("summary", ""), files)
        return {
            "commitUrl": f"{self.url}/{repo.repo_id}/commit/{commit.oid}",
            "commitOid": commit.oid,
            "success": True,
        }

    def lfs_batch(self, repo: Repo, body: dict) -> dict:
        objects = []
        for obj in body.get("objects", []):
            item = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in repo.lfs:
                key = secrets.token_hex(8)
                self._upload_keys[key] = repo.repo_id
                href = f"{self.url}/_lfs/{quote(repo.repo_id, safe='')}/{obj['oid']}?key={key}&size={obj['size']}"
                item["actions"] = {"upload": {"href": href, "header": {}}}
            objects.append(item)
        return {"transfer": "basic", "objects": objects}

    def lfs_put(self, repo_id: str, oid: str, query: dict, data: bytes) -> None:
        key = query.get("key", [""])[0]
        if self._upload_keys.get(key) != repo_id:
            raise HubStoreError(403, "Invalid or expired LFS upload URL")
        if hashlib.sha256(data).hexdigest() != oid or str(len(data)) != query.get("size", [""])[0]:
            raise HubStoreError(400, f"Uploaded content does not match LFS object {oid}")
        del self._upload_keys[key]
        self.repos[repo_id].lfs[oid] = data

    def space_variables(self, key: str, method: str, body: dict) -> dict:
        """GET lists, POST adds or replaces `body["key"]`, DELETE removes it; each returns all variables."""
        variables = self.variables[key]
        if method == "POST":
            if not str(body.get("key", "")).replace("_", "").isalnum():
                raise HubStoreError(400, f"invalid variable name {body.get('key')!r}")
            variables[body["key"]] = {
                "value": str(body.get("value", "")),
                "description": body.get("description"),
                "updatedAt": _iso(time.time()),
            }
        elif method == "DELETE":
            variables.pop(body.get("key"), None)
        return dict(variables)


def _make_handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30

        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

        def do_GET(self):
            self._dispatch()

        def do_HEAD(self):
            self._dispatch()

        def do_POST(self):
            self._dispatch()

        def do_PUT(self):
            self._dispatch()

        def do_DELETE(self):
            self._dispatch()

        def _dispatch(self) -> None:
            parts = urlsplit(self.path)
            segments = _space_as_model_path([unquote(s) for s in parts.path.strip("/").split("/")])
            query = parse_qs(parts.query)
            route = _route_name(self.command, segments)
            hub.requests.append((self.command, route))
            length = int(self.headers.get("Content-Length") or 0)
            if hub.take_drop(route):
                self.rfile.read(length // 2)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if length > MAX_BODY:
                self.close_connection = True
                self._send(413, {"error": f"request body over {MAX_BODY} bytes"}, {})
                return
            body = self.rfile.read(length) if length else b""
            try:
                with hub.lock:
                    user = hub.user_for(self.headers.get("Authorization"))
                    status, payload, headers = self._handle(route, segments, query, body, user)
            except HubStoreError as err:
                headers = {"X-Error-Message": err.message}
                if err.error_code:
                    headers["X-Error-Code"] = err.error_code
                status, payload = err.status, {"error": err.message, **err.extra}
            self._send(status, payload, headers)

        def _send(self, status: int, payload, headers: dict) -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            if not isinstance(payload, bytes):
                self.send_header("Content-Type", "application/json")
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _handle(self, route, seg, query, body: bytes, user):
            if route == "unknown":
                raise HubStoreError(404, f"{self.command} {self.path} is not served by the test Hub")
            as_json = json.loads(body) if body and route != "commit" and route != "lfs_put" else {}
            if route == "whoami":
                if user is None:
                    raise HubStoreError(401, "You must be authenticated")
                return 200, {"type": "user", "name": user, "auth": {"accessToken": {"role": "write"}}}, {}
            if route == "create_repo":
                status, payload = hub.create_repo(as_json, user)
                return status, payload, {}
            if route == "validate_yaml":
                errors = validate_card_yaml(as_json.get("content", ""), as_json.get("repoType") or "model")
                if errors:
                    raise HubStoreError(400, "Invalid metadata in README.md: " + "; ".join(errors))
                return 200, {"errors": [], "warnings": []}, {}
            if route == "lfs_put":
                hub.lfs_put(seg[1], seg[2], query, body)
                return 200, {}, {}
            if route == "lfs_batch":
                repo = hub.writable(f"{seg[0]}/{seg[1].removesuffix('.git')}", user)
                return 200, hub.lfs_batch(repo, as_json), {"Content-Type": "application/vnd.git-lfs+json"}
            if route == "resolve":
                repo = hub.readable(f"{seg[0]}/{seg[1]}", user)
                commit, path = repo.resolve(seg[3]), "/".join(seg[4:])
                if path not in commit.files:
                    raise HubStoreError(404, f"{path} does not exist at {seg[3]}", "EntryNotFound")
                entry = repo.entry(path, commit.files[path])
                etag = entry.get("lfs", {}).get("oid", entry["oid"])
                return 200, commit.files[path], {"X-Repo-Commit": commit.oid, "ETag": f'"{etag}"'}
            repo_id, rest = f"{seg[2]}/{seg[3]}", seg[4:]
            if route == "variables":
                repo = (hub.writable if self.command != "GET" else hub.readable)(repo_id, user)
                return 200, hub.space_variables(repo_id, self.command, as_json), {}
            if route in ("commit", "preupload", "branch", "delete_branch", "tag"):
                repo = hub.writable(repo_id, user)
            else:
                repo = hub.readable(repo_id, user)
            if route == "info":
                return 200, hub.model_info(repo, rest[1] if rest else "main"), {}
            if route == "tree":
                recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                return 200, hub.tree(repo, rest[1], "/".join(rest[2:]), recursive), {}
            if route == "refs":
                return 200, _refs(repo), {}
            if route == "preupload":
                return 200, hub.preupload(repo, rest[1], as_json), {}
            if route == "commit":
                lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                return 200, hub.commit(repo, rest[1], lines), {}
            if route == "branch":
                if rest[1] in repo.branches:
                    raise HubStoreError(409, f"Branch {rest[1]} already exists")
                repo.branches[rest[1]] = repo.resolve(as_json.get("startingPoint") or "main").oid
                return 200, {}, {}
            if route == "delete_branch":
                if repo.branches.pop(rest[1], None) is None:
                    raise HubStoreError(404, f"Invalid rev id: {rest[1]}", "RevisionNotFound")
                return 200, {}, {}
            if route == "tag":
                if as_json["tag"] in repo.tags:
                    raise HubStoreError(409, f"Tag {as_json['tag']} already exists")
                repo.tags[as_json["tag"]] = repo.resolve(rest[1]).oid
                return 200, {}, {}
            raise AssertionError(f"route {route} has no handler")

    return Handler


def _space_as_model_path(seg: list[str]) -> list[str]:
    """Rewrite a Space URL to the model URL shape with owner "spaces/<owner>" (repo key "spaces/owner/name")."""
    if seg[:2] == ["api", "spaces"] and len(seg) >= 4:
        return ["api", "models", f"spaces/{seg[2]}", *seg[3:]]
    if seg[0] == "spaces" and len(seg) >= 3:
        return [f"spaces/{seg[1]}", *seg[2:]]
    return seg


def _route_name(method: str, seg: list[str]) -> str:
    """Name the endpoint a request targets (used for dispatch, fault injection and the request log)."""
    if seg[:2] == ["api", "whoami-v2"]:
        return "whoami"
    if seg[:3] == ["api", "repos", "create"] and method == "POST":
        return "create_repo"
    if seg[:2] == ["api", "validate-yaml"]:
        return "validate_yaml"
    if seg[:2] == ["api", "models"] and len(seg) >= 4:
        action = seg[4] if len(seg) > 4 else ""
        if action in ("", "revision") and method in ("GET", "HEAD"):
            return "info"
        if action == "branch" and len(seg) == 6:
            return "delete_branch" if method == "DELETE" else "branch"
        if action in ("tree", "refs", "preupload", "commit", "tag"):
            return action
        if action == "variables" and seg[2].startswith("spaces/"):
            return "variables"
    if seg[0] == "_lfs" and len(seg) == 3 and method == "PUT":
        return "lfs_put"
    if len(seg) == 6 and seg[1].endswith(".git") and seg[2:] == ["info", "lfs", "objects", "batch"]:
        return "lfs_batch"
    if len(seg) >= 5 and seg[2] == "resolve" and method in ("GET", "HEAD"):
        return "resolve"
    return "unknown"


def _refs(repo: Repo) -> dict:
    def refs(names: dict[str, str], kind: str) -> list[dict]:
        return [
            {"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": oid} for n, oid in sorted(names.items())
        ]

    return {
        "branches": refs(repo.branches, "heads"),
        "tags": refs(repo.tags, "tags"),
        "converts": [],
        "pullRequests": [],
    }
