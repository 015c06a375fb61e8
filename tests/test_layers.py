"""The package's wings form floors: a module imports only from its own wing or the wings below it; and no module
imports itself round a loop, within a wing either.

Floors, bottom up: errors -> algos -> generation -> config -> records -> training -> hub -> tasks -> compare -> cli. Read from the AST of every module
(imports inside functions count too), so a lazy import cannot climb a floor or close a loop unseen.

benchmarks/ sits outside the package, in rooms by what they measure (its sub-packages): a benchmark imports only
from its own room and the shared modules at the top of benchmarks/, which import no room; no loop either; no folder
holds more than MAX_MODULES modules and no module is longer than MAX_LINES lines.
"""

import ast
from pathlib import Path

import grpo_hub

PACKAGE = Path(grpo_hub.__file__).parent
FLOORS = ["errors", "algos", "generation", "config", "records", "training", "hub", "tasks", "compare", "cli"]
BENCHMARKS = PACKAGE.parent / "benchmarks"
MAX_MODULES, MAX_LINES = 12, 500  # per benchmark folder, per benchmark module


def wing(module: str) -> str | None:
    """The wing of a dotted grpo_hub module name (None for the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "grpo_hub" else None


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every grpo_hub module imported by the file at `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("grpo_hub")
        ):
            found.append((node.lineno, node.module))
            found += [
                (node.lineno, f"{node.module}.{a.name}") for a in node.names if node.module == "grpo_hub"
            ]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("grpo_hub")]
    return found


def upward_imports(package: Path = PACKAGE) -> list[str]:
    problems = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        own = relative.parts[0].removesuffix(".py")
        if own not in FLOORS:
            continue  # the package root (__init__) only re-exports lazily
        for line, module in imported_modules(path):
            target = wing(module)
            if target in FLOORS and FLOORS.index(target) > FLOORS.index(own):
                problems.append(
                    f"grpo_hub/{relative}:{line} ({own}) imports {module} ({target}, a higher floor)"
                )
    return problems


def module_name(path: Path, package: Path) -> str:
    """The dotted name of the module (or package, for its __init__.py) at `path` inside `package`."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of `package` -> the modules of `package` it imports, read from its AST (imports inside functions
    and `if __name__ == "__main__":` count too); `from M import n` is an import of the submodule M.n where there is
    one, else of M; relative imports are resolved."""
    files = {module_name(path, package): path for path in sorted(package.rglob("*.py"))}
    graph = {}
    for name, path in files.items():
        own = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*own[: len(own) - node.level + 1], *([base] if base else [])])
                imported |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        graph[name] = {module for module in imported if module in files and module != name}
    return graph


def import_cycles(package: Path = PACKAGE) -> list[list[str]]:
    """Every group of modules that import each other, directly or round a loop (the strongly connected groups of
    `import_graph` with more than one module), each sorted."""
    graph = import_graph(package)
    reach = {}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo += graph[module]
        reach[start] = seen
    groups = {
        tuple(sorted(m for m in reach[start] if start in reach[m]))
        for start in graph
        if start in reach[start]
    }
    return sorted(list(group) for group in groups)


def room(module: str, root: Path = BENCHMARKS) -> str | None:
    """The room (sub-package of `root`) of a dotted module name under it; None for the modules at its top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (root / parts[1]).is_dir() else None


def room_crossings(root: Path = BENCHMARKS) -> list[str]:
    """'importer imports imported' for each import of another room's module by a benchmark, and of any room's by a
    shared module at the top; the runner (`__main__`, which starts every benchmark) is left out."""
    problems = []
    for module, imported in sorted(import_graph(root).items()):
        if module.split(".")[-1] != "__main__":
            own = room(module, root)
            problems += [
                f"{module} imports {t}" for t in sorted(imported) if room(t, root) not in (None, own)
            ]
    return problems


def oversized(root: Path = BENCHMARKS) -> list[str]:
    """Each folder of `root` (itself and its packages) with more than MAX_MODULES modules, each module longer than
    MAX_LINES lines."""
    folders = [root, *sorted(path.parent for path in root.glob("*/__init__.py"))]
    counts = {folder: len(list(folder.glob("*.py"))) for folder in folders}
    lengths = {path: len(path.read_text().splitlines()) for path in sorted(root.rglob("*.py"))}
    return [f"{f.relative_to(root.parent)}/: {n} modules" for f, n in counts.items() if n > MAX_MODULES] + [
        f"{p.relative_to(root.parent)}: {n} lines" for p, n in lengths.items() if n > MAX_LINES
    ]


def test_every_wing_is_a_floor():
    wings = {
        p.name.removesuffix(".py")
        for p in PACKAGE.iterdir()
        if p.name != "__init__.py" and not p.name.startswith("__")
    }
    assert wings == set(FLOORS)


def test_no_import_climbs_a_floor():
    assert upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path):
    fake = tmp_path / "grpo_hub"
    for wing in ("algos", "config"):
        (fake / wing).mkdir(parents=True)
    (fake / "algos" / "bad.py").write_text(
        "def f():\n    from grpo_hub.config.hub_config import GRPOHubConfig\n"
    )
    (fake / "config" / "bad.py").write_text("import grpo_hub.training.trainer\n")
    assert upward_imports(fake) == [
        "grpo_hub/algos/bad.py:2 (algos) imports grpo_hub.config.hub_config (config, a higher floor)",
        "grpo_hub/config/bad.py:1 (config) imports grpo_hub.training.trainer (training, a higher floor)",
    ]


def test_no_module_imports_itself_round_a_loop():
    assert import_cycles() == []


def test_the_check_sees_every_import_loop(tmp_path):
    fake = tmp_path / "grpo_hub"
    (fake / "tasks").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "tasks" / "__init__.py").write_text("from grpo_hub.tasks import model\n")  # a submodule: no loop
    (fake / "tasks" / "model.py").write_text(
        "SHIPPED = 1\nif __name__ == '__main__':\n    from grpo_hub.tasks.machines import record\n"
    )
    (fake / "tasks" / "machines.py").write_text(
        "from grpo_hub.tasks.model import SHIPPED\ndef record(): ...\n"
    )
    (fake / "a.py").write_text("def f():\n    import grpo_hub.b\n")
    (fake / "b.py").write_text("from . import c\n")
    (fake / "c.py").write_text("from grpo_hub import a\n")
    assert import_cycles(fake) == [
        ["grpo_hub.a", "grpo_hub.b", "grpo_hub.c"],
        ["grpo_hub.tasks.machines", "grpo_hub.tasks.model"],
    ]
    (fake / "tasks" / "model.py").write_text("SHIPPED = 1\n")
    (fake / "c.py").write_text("")
    assert import_cycles(fake) == []


def test_the_architecture_page_names_the_floors_in_order():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    line = next(line for line in page.splitlines() if line.startswith("- Floors from the bottom:"))
    named = [part.strip(" `.") for part in line.split(":", 1)[1].split(". A module")[0].split("→")]
    assert named == FLOORS
    assert all(f"  {wing}" in page for wing in FLOORS[1:-1])  # each wing has its line in the layout


def test_the_readme_names_every_wing_in_floor_order_and_links_the_page():
    """The README's Architecture section says the floors from this file's list: every wing, in floor order, no
    other package path; the order itself is the architecture page's (linked)."""
    import re

    readme = (PACKAGE.parent / "README.md").read_text()
    section = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    assert "(docs/architecture.md)" in section and "tests/test_layers.py" in section
    named = [m.removesuffix("/").removesuffix(".py") for m in re.findall(r"`([a-z_]+(?:/|\.py))`", section)]
    outside = {"recipes", "spaces_app", "benchmarks"}
    assert [name for name in named if name not in outside] == FLOORS
    assert all((PACKAGE.parent / name).is_dir() for name in outside & set(named))


def test_each_benchmark_imports_only_its_room_and_the_shared_modules():
    assert room_crossings() == []


def test_no_benchmark_imports_itself_round_a_loop():
    assert import_cycles(BENCHMARKS) == []


def test_benchmark_folders_and_modules_stay_small():
    assert oversized() == []


def test_the_benchmark_checks_see_crossings_and_sizes(tmp_path):
    fake = tmp_path / "benchmarks"
    for folder in ("step_cost", "accuracy"):
        (fake / folder).mkdir(parents=True)
        (fake / folder / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text("from benchmarks.accuracy import timed\n")  # the runner: any room
    (fake / "common.py").write_text("def f():\n    from benchmarks.step_cost import step\n")
    (fake / "step_cost" / "step.py").write_text("from benchmarks import common\nfrom . import packed\n")
    (fake / "step_cost" / "packed.py").write_text("from benchmarks.accuracy.timed import run\n")
    (fake / "accuracy" / "timed.py").write_text(
        "from benchmarks.common import f\nrun = 1\n" + "x = 1\n" * MAX_LINES
    )
    for n in range(MAX_MODULES - 1):
        (fake / "accuracy" / f"m{n}.py").write_text("")
    assert room_crossings(fake) == [
        "benchmarks.common imports benchmarks.step_cost.step",
        "benchmarks.step_cost.packed imports benchmarks.accuracy.timed",
    ]
    loop = [
        "benchmarks.accuracy.timed",
        "benchmarks.common",
        "benchmarks.step_cost.packed",
        "benchmarks.step_cost.step",
    ]
    assert import_cycles(fake) == [loop]
    assert oversized(fake) == [
        "benchmarks/accuracy/: 13 modules",
        f"benchmarks/accuracy/timed.py: {MAX_LINES + 2} lines",
    ]
