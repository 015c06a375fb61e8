"""In-memory git-like storage behind the local Hub test server: repos, commits, branches, tags, LFS blobs.

A commit is an immutable snapshot `{path: bytes}` with a parent; branches and tags map names to commit
ids. Files whose upload mode is "lfs" are committed by sha256 and must have been PUT to the repo's LFS
store first, as on the real Hub.
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass, field

LFS_SUFFIXES = (".safetensors", ".bin", ".png", ".pt", ".pth", ".jpg")
LFS_MIN_SIZE = 10 * 1024 * 1024
GITATTRIBUTES = (
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.png filter=lfs diff=lfs merge=lfs -text\n"
)


def git_blob_oid(content: bytes) -> str:
    """The git object id of a blob: sha1 over `blob <size>\\0<content>`."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def is_lfs_path(path: str, size: int) -> bool:
    """Upload mode rule (stands in for the Hub's .gitattributes): binary suffixes and big files go to LFS."""
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


class HubStoreError(Exception):
    """An error the server reports as `status` with the Hub's `X-Error-Code` (may be empty)."""

    def __init__(self, status: int, message: str, error_code: str = "", **extra):
        super().__init__(message)
        self.status, self.message, self.error_code, self.extra = status, message, error_code, extra


@dataclass(frozen=True)
class Commit:
    oid: str
    parent: str | None
    title: str
    files: dict[str, bytes]
    date: float


@dataclass
class Repo:
    repo_id: str
    owner: str
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    lfs: dict[str, bytes] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit:
        """Branch, tag or full commit id -> commit; unknown -> 404 RevisionNotFound."""
        oid = self.branches.get(revision) or self.tags.get(revision)
        if oid is None and revision in self.commits:
            oid = revision
        if oid is None:
            raise HubStoreError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return self.commits[oid]

    def add_commit(self, branch: str, title: str, files: dict[str, bytes]) -> Commit:
        """Record a snapshot as the new head of `branch` (the branch must exist, except for the first commit)."""
        parent = self.branches.get(branch)
        seed = f"{self.repo_id}\0{parent}\0{title}\0{len(self.commits)}\0{time.time_ns()}".encode()
        digest = hashlib.sha1(seed + b"".join(hashlib.sha1(files[p]).digest() for p in sorted(files)))
        commit = Commit(digest.hexdigest(), parent, title, dict(files), time.time())
        self.commits[commit.oid] = commit
        self.branches[branch] = commit.oid
        return commit

    def entry(self, path: str, content: bytes) -> dict:
        """Tree entry of a file in the Hub's JSON shape (LFS files carry their sha256)."""
        item = {"type": "file", "path": path, "size": len(content), "oid": git_blob_oid(content)}
        if is_lfs_path(path, len(content)):
            sha = hashlib.sha256(content).hexdigest()
            item["lfs"] = {"oid": sha, "size": len(content), "pointerSize": 134}
        return item


def new_repo(repo_id: str, owner: str, private: bool) -> Repo:
    """A repo with the Hub's initial commit (`.gitattributes`) on `main`."""
    repo = Repo(repo_id, owner, private)
    repo.add_commit("main", "initial commit", {".gitattributes": GITATTRIBUTES})
    return repo


def apply_operations(repo: Repo, base: Commit, operations: list[dict]) -> dict[str, bytes]:
    """Files of `base` after the NDJSON commit operations (`file`, `lfsFile`, `deletedFile`, `deletedFolder`)."""
    files = dict(base.files)
    for op in operations:
        key, value = op.get("key"), op.get("value") or {}
        path = value.get("path", "")
        if key == "file":
            files[path] = base64.b64decode(value["content"])
        elif key == "lfsFile":
            if value.get("oid") not in repo.lfs:
                raise HubStoreError(422, f"LFS object {value.get('oid')} for {path} was never uploaded")
            files[path] = repo.lfs[value["oid"]]
        elif key == "deletedFile":
            if path not in files:
                raise HubStoreError(404, f"File {path} does not exist", "EntryNotFound")
            del files[path]
        elif key == "deletedFolder":
            files = {p: c for p, c in files.items() if not p.startswith(path.rstrip("/") + "/")}
        else:
            raise HubStoreError(400, f"Unknown commit operation {key!r}")
    return files
