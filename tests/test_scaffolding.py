"""Test modules share scaffolding through helper modules only: no module under tests/ imports a `test_*.py`
module (read from the AST, imports inside functions and relative imports included). Every worker script the
distributed tests launch ends its ranks' process group (`worker_common.end_ranks`) as its last act. Every
third-party module the project or its tests import is a distribution pyproject.toml declares, so a package the
machine happens to have never hides a missing one."""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
WORKER_COMMON = "tests.training.distributed.worker_common"
FIRST_PARTY = frozenset({"grpo_hub", "spaces_app", "recipes", "tests", "benchmarks"})
# what each part of the checkout may import: the package, its Space app and recipes any declared distribution (the
# core dependencies, or an extra for an optional feature); the tests those and the dev extra too
SHIPPED, TESTED = ("grpo_hub", "spaces_app", "recipes"), ("tests",)


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


def imports_by_file(root: Path):
    """(path, `imported_names(path, root)`) of every Python file under `root`, in path order."""
    for path in sorted(root.rglob("*.py")):
        yield path, imported_names(path, root)


def imports_of_test_modules(root: Path = TESTS) -> list[str]:
    """'importer:line imports <a test module>' for every import of a test module by a module under `root`."""
    problems = []
    for path, imports in imports_by_file(root):
        for line, name in imports:
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


def workers_that_leave_their_ranks(root: Path = TESTS) -> list[str]:
    """Worker scripts (modules that import tests.training.distributed.worker_common and have a `__main__` block)
    whose `__main__` block does not end with `end_ranks()` or `run_each(...)` (which calls it)."""
    problems = []
    for path, imports in imports_by_file(root):
        if not any(name.startswith(WORKER_COMMON) for _, name in imports):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                last = node.body[-1]
                call = last.value if isinstance(last, ast.Expr) else None
                if not (isinstance(call, ast.Call) and ast.unparse(call.func) in ("end_ranks", "run_each")):
                    problems.append(str(path.relative_to(root.parent)))
    return problems


def test_every_worker_script_ends_its_process_group():
    problems = workers_that_leave_their_ranks()
    assert not problems, "end the __main__ block with end_ranks() (worker_common):\n" + "\n".join(problems)


def test_the_worker_check_reads_the_main_block(tmp_path):
    wing = tmp_path / "tests" / "wing"
    wing.mkdir(parents=True)
    header = "from tests.training.distributed.worker_common import end_ranks\n"
    (wing / "ends.py").write_text(header + "if __name__ == '__main__':\n    main()\n    end_ranks()\n")
    (wing / "leaves.py").write_text(header + "if __name__ == '__main__':\n    end_ranks()\n    main()\n")
    (wing / "not_a_worker.py").write_text("if __name__ == '__main__':\n    main()\n")
    assert workers_that_leave_their_ranks(tmp_path / "tests") == ["tests/wing/leaves.py"]


def normalized(name: str) -> str:
    """A distribution name in PEP 503's normal form ('PyYAML' -> 'pyyaml', 'math_verify' -> 'math-verify')."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions(pyproject: dict, extras_left_out=()) -> set[str]:
    """Normalized names of the distributions `pyproject` (parsed) declares: its dependencies and every extra's, but
    `extras_left_out`'s."""
    from packaging.requirements import Requirement

    project = pyproject["project"]
    groups = [project["dependencies"]]
    groups += [
        reqs for extra, reqs in project["optional-dependencies"].items() if extra not in extras_left_out
    ]
    return {normalized(Requirement(req).name) for reqs in groups for req in reqs}


def undeclared_imports(roots, declared: set[str], distributions: dict[str, list[str]]) -> list[str]:
    """'file:line imports <module> (distribution ...)' for each import under `roots` (lazy ones included) of a module
    outside the standard library and this checkout (FIRST_PARTY, each root) whose distributions (`distributions`: module -> names, as
    `importlib.metadata.packages_distributions()`; the module's own name when it is not installed) are not declared."""
    problems = []
    for root in roots:
        for path, imports in imports_by_file(root):
            for line, name in imports:
                module = name.split(".")[0]
                if module in sys.stdlib_module_names or module in FIRST_PARTY | {root.name}:
                    continue
                names = distributions.get(module, [module])
                if not declared & {normalized(n) for n in names}:
                    where = path.relative_to(root.parent)
                    problems.append(f"{where}:{line} imports {module} (distribution {', '.join(names)})")
    return sorted(set(problems))


def test_every_imported_third_party_module_is_declared():
    """Issue 73: `requests` was imported and declared nowhere; CI passed only because the machine's Python had it."""
    tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads pyproject.toml")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    distributions = importlib.metadata.packages_distributions()
    problems = undeclared_imports(
        [ROOT / r for r in SHIPPED], declared_distributions(pyproject, ["dev"]), distributions
    )
    problems += undeclared_imports(
        [ROOT / r for r in TESTED], declared_distributions(pyproject), distributions
    )
    assert not problems, (
        "declare each in pyproject.toml (dependencies, or the extra that needs it):\n" + "\n".join(problems)
    )


def test_the_declaration_check_maps_modules_to_distributions(tmp_path):
    wing = tmp_path / "pkg"
    wing.mkdir()
    (wing / "a.py").write_text(
        "import os, yaml\nfrom . import b\nimport pkg.b\nimport tests.helpers\n"
        "def f():\n    import requests.adapters\n    from absent_thing import x\n"
    )
    pyproject = {"project": {"dependencies": ["PyYAML>=6"], "optional-dependencies": {"dev": ["requests"]}}}
    distributions = {"yaml": ["PyYAML"], "requests": ["requests"]}
    found = undeclared_imports([wing], declared_distributions(pyproject, ["dev"]), distributions)
    assert found == [
        "pkg/a.py:6 imports requests (distribution requests)",
        "pkg/a.py:7 imports absent_thing (distribution absent_thing)",
    ]
    assert undeclared_imports([wing], declared_distributions(pyproject), distributions) == [
        "pkg/a.py:7 imports absent_thing (distribution absent_thing)"
    ]
