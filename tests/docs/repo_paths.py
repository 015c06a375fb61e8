"""Repository paths named in prose: found in every Markdown page, YAML comment and Python comment or docstring,
then checked against the tree.

The rule (what counts as a repository path):
- a token starting with a top-level folder (`grpo_hub/`, `recipes/`, `benchmarks/`, `tests/`, `docs/`,
  `spaces_app/`, `.ci/`) or with a wing of the package (`training/`, `algos/`, ... = `grpo_hub/training/`, ...)
  names that file or folder from the repository root;
- a bare file name ending in `.md` or `.yaml` (a page, a preset) names a file beside the text, at the root, or
  anywhere in the tree; a bare `.py` name is not checked (prose cites TRL's, verl's and GRESO's files as often
  as ours): a module of this repository is named with its folder, and that is checked;
- a dotted name `grpo_hub.<module>` (also `benchmarks.`, `tests.`, `spaces_app.`) names a module, or a name a module
  defines or imports at top level;
A token glued to a `/`, `.` or word character on its left is part of something else (a URL, `trl/scripts/grpo.py`)
and is skipped; `::name` and `:line` after a path refer to the file part; a glob or placeholder (`*`, `<`, `{`)
ends the path at the folder before it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
TOP_FOLDERS = ("grpo_hub", "recipes", "benchmarks", "tests", "docs", "spaces_app", ".ci")
WINGS = tuple(p.name for p in sorted((ROOT / "grpo_hub").iterdir()) if (p / "__init__.py").is_file())
PACKAGES = ("grpo_hub", "benchmarks", "tests", "spaces_app")
BARE_SUFFIXES = (".md", ".yaml")
FILE_SUFFIXES = (".py", ".md", ".yaml", ".json")  # `benchmarks.md` is a file, not a module
SKIPPED_DIRS = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", "outputs", "build", "dist"}

_PATH_START = "|".join(re.escape(name) for name in (*TOP_FOLDERS, *WINGS))
PATH = re.compile(rf"(?<![\w/.-])((?:{_PATH_START})/[\w./*<>{{}}-]*)")
BARE = re.compile(rf"(?<![\w/.-])([\w-]+(?:{'|'.join(re.escape(s) for s in BARE_SUFFIXES)}))(?![\w/-])")
DOTTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)})(?:\.\w+)+)")


class Mention(NamedTuple):
    """One path-like token: the file it appears in, its line and the token."""

    source: Path
    line: int
    token: str

    def __str__(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line}: {self.token}"


def repository_files(root: Path = ROOT) -> list[Path]:
    """Every file of the tree, build outputs, caches and virtual environments left out."""
    found = []
    for path in root.rglob("*"):
        parts = path.relative_to(root).parts
        if any(
            part in SKIPPED_DIRS or part.endswith(".egg-info") or part.startswith(".venv") for part in parts
        ):
            continue
        if path.is_file():
            found.append(path)
    return found


def python_prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment (tokenize) and docstring (ast) of a Python module."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                start = node.body[0].lineno
                for offset, text in enumerate(docstring.splitlines()):
                    yield start + offset, text


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of the prose of a file: all of a Markdown page, YAML comments, Python comments and docstrings."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        yield from python_prose(text)
    elif path.suffix == ".md":
        yield from enumerate(text.splitlines(), start=1)
    elif path.suffix == ".yaml":
        for number, line in enumerate(text.splitlines(), start=1):
            if "#" in line:
                yield number, line[line.index("#") :]


def path_part(token: str) -> str:
    """The folder or file a path token names: up to a glob or placeholder, without trailing punctuation."""
    cut = re.split(r"[*<{]", token, maxsplit=1)[0]
    if cut != token:
        cut = cut[: cut.rfind("/") + 1]
    return cut.rstrip(".,")


def top_level_names(module: Path) -> set[str]:
    """Names a module binds at top level (defs, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


class Checker:
    """Resolves the tokens of the rule against the tree at `root`."""

    def __init__(self, root: Path = ROOT):
        self.root = root
        self.names = {path.name for path in repository_files(root)}

    def path_exists(self, token: str) -> bool:
        part = path_part(token)
        first = part.split("/", 1)[0]
        base = self.root / "grpo_hub" if first in WINGS else self.root
        return (base / part).exists()

    def bare_exists(self, token: str, source: Path) -> bool:
        return (source.parent / token).exists() or (self.root / token).exists() or token in self.names

    def dotted_exists(self, token: str) -> bool:
        parts = token.split(".")
        for end in range(len(parts), 0, -1):
            base = self.root.joinpath(*parts[:end])
            module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            if module.is_file():
                return (
                    end == len(parts) or parts[end] in top_level_names(module) or (base / parts[end]).exists()
                )
        return False

    def missing(self, source: Path) -> list[Mention]:
        """The mentions in `source` that name nothing in the tree."""
        found = []
        for line, text in prose(source):
            bad = [t for t in PATH.findall(text) if not self.path_exists(t)]
            bad += [t for t in BARE.findall(text) if not self.bare_exists(t, source)]
            dotted = [t for t in DOTTED.findall(text) if not t.endswith(FILE_SUFFIXES)]
            bad += [t for t in dotted if not self.dotted_exists(t)]
            found += [Mention(source, line, token) for token in bad]
        return found


def scanned_files(root: Path = ROOT) -> list[Path]:
    """The files whose prose is checked: every Markdown page, every YAML file, every Python module."""
    return sorted(p for p in repository_files(root) if p.suffix in (".md", ".py", ".yaml"))
