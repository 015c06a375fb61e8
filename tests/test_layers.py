"""The package's wings form floors: a module imports only from its own wing or the wings below it.

Floors, bottom up: errors -> algos -> generation -> config -> records -> training -> hub -> tasks -> compare -> cli. Read from the AST of every module
(imports inside functions count too), so a lazy import cannot climb a floor unseen.
"""

import ast
from pathlib import Path

import grpo_hub

PACKAGE = Path(grpo_hub.__file__).parent
FLOORS = ["errors", "algos", "generation", "config", "records", "training", "hub", "tasks", "compare", "cli"]


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
