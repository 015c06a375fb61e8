"""Test modules share scaffolding through helper modules only: no module under tests/ imports a `test_*.py`
module (read from the AST, imports inside functions and relative imports included)."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_names(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every module, or module attribute, that the file at `path` imports; relative
    imports are resolved against its package under `root`'s parent."""
    package = path.relative_to(root.parent).parent.parts
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *(node.module or "").split("."))).strip(".")
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return sorted(found)


def imports_of_test_modules(root: Path = TESTS) -> list[str]:
    """'importer:line imports <a test module>' for every import of a test module by a module under `root`."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        for line, name in imported_names(path, root):
            target = root.parent.joinpath(*name.split(".")).with_suffix(".py")
            if target.name.startswith("test_") and target.is_file() and target != path:
                problems.append(f"{path.relative_to(root.parent)}:{line} imports {name}")
    return problems


def test_no_module_imports_a_test_module():
    problems = imports_of_test_modules()
    assert not problems, "move what is shared into the wing's helper module:\n" + "\n".join(problems)


def test_the_check_sees_lazy_and_relative_imports(tmp_path):
    wing = tmp_path / "tests" / "wing"
    wing.mkdir(parents=True)
    for name in ("__init__.py", "test_a.py", "helpers.py"):
        (wing / name).write_text("")
    (tmp_path / "tests" / "__init__.py").write_text("")
    (wing / "test_b.py").write_text(
        "from tests.wing.helpers import x\n"
        "from . import helpers\n"
        "def f():\n    from .test_a import y\n"
        "def g():\n    from tests.wing import test_a\n"
        "import tests.wing.test_a\n"
    )
    assert imports_of_test_modules(tmp_path / "tests") == [
        "tests/wing/test_b.py:4 imports tests.wing.test_a",
        "tests/wing/test_b.py:6 imports tests.wing.test_a",
        "tests/wing/test_b.py:7 imports tests.wing.test_a",
    ]
