"""Smoke test of `python -m benchmarks --quick`: every benchmark runs and prints its full table.

Checks the rows and that every ratio is a finite number; never a timing value (see ../shared/DESIGN.md,
"Benchmarks, not timed tests").
"""

import math
import re
import subprocess
import sys

import pytest

from benchmarks.__main__ import BENCHMARKS
from tests.conftest import REPO_ROOT, RUN_LIMIT_S

pytestmark = pytest.mark.slow
REPO = REPO_ROOT


@pytest.fixture(scope="module")
def sections() -> dict[str, str]:
    """{benchmark name: its printed output} from one `python -m benchmarks --quick` run."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    parts = re.split(r"^# benchmarks\.\w+\.(\w+) .*$", done.stdout, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def table_rows(text: str) -> list[list[str]]:
    """Cells of every Markdown table body row in `text` (header and separator rows left out)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    return [row for i, row in enumerate(rows) if not row[0].startswith("---") and not _is_header(rows, i)]


def _is_header(rows: list[list[str]], i: int) -> bool:
    return i + 1 < len(rows) and rows[i + 1][0].startswith("---")


def finite(cell: str) -> float:
    value = float(cell)
    assert math.isfinite(value), cell
    return value


def test_every_benchmark_ran(sections):
    assert set(sections) == set(BENCHMARKS)


def test_step_time_table(sections):
    rows = table_rows(sections["step_time"])
    sweep = [row for row in rows if row[1] in ("hub-off", "hub-filter")]
    assert [(row[0], row[1]) for row in sweep] == [
        (f, kind) for f in ("0.00", "0.25", "0.50", "0.75") for kind in ("hub-off", "hub-filter")
    ]
    for row in sweep:
        assert all(finite(cell) > 0 for cell in row[3:])
    pooled = {row[0]: row[1:] for row in rows if row[0].startswith(("train", "whole"))}
    assert set(pooled) == {"train (generation excluded)", "whole step (generation included)"}
    assert all(finite(cell) > 0 for cells in pooled.values() for cell in cells)


def test_memory_table(sections):
    rows = {row[0]: row[1:] for row in table_rows(sections["memory"])}
    assert set(rows) == {"trl-full", "trl-full-sync", "trl-lora", "hub-lora-ref"}
    assert finite(rows["trl-full-sync"][1]) == 1.0  # the full copy is the unit
    assert (
        finite(rows["trl-full"][1]) == finite(rows["trl-lora"][1]) == 0.0
    )  # no reference / base as reference
    assert 0 < finite(rows["hub-lora-ref"][1]) < 1
    assert all(finite(cell) > 0 for cells in rows.values() for cell in cells[2:4])  # peak RSS
    for variant in ("trl-full-sync", "hub-lora-ref"):  # peak minus its baseline's (can be negative: noise)
        finite(rows[variant][4])


@pytest.mark.parametrize("name", ["filtering", "reference", "scoring_forward"])
def test_other_benchmarks_print_finite_ratios(sections, name):
    numbers = re.findall(r"-?\d+\.\d+|nan|inf", sections[name])
    assert numbers, sections[name]
    assert all(math.isfinite(float(n)) for n in numbers)


def test_shared_prompts_tables(sections):
    """Both shapes print the three forwards (the quick prompt-heavy shape in 2 micro-batches: also whole groups);
    shared prompts compute fewer tokens per real token (a count), whole groups fewer still."""
    tables = sections["shared_prompts"].split("## Main job")
    assert len(tables) == 2
    for table, whole in zip(tables, (["shared prompts, whole groups"], []), strict=True):
        rows = {row[0]: row for row in table_rows(table)}
        assert set(rows) == {"padded (TRL)", "padding-free", "shared prompts", *whole}
        for row in rows.values():
            assert all(finite(cell.split()[0].replace(",", "")) > 0 for cell in row[1:7])
        assert finite(rows["shared prompts"][5]) < finite(rows["padding-free"][5])
        if whole:
            assert finite(rows[whole[0]][5]) < finite(rows["shared prompts"][5])


def test_rollout_budget_table(sections):
    """Both steps generate the batch's rows; uniform budgets are num_generations each, knapsack's within bounds."""
    rows = {row[0]: row for row in table_rows(sections["rollout_budget"])}
    assert set(rows) == {"uniform (TRL)", "knapsack"}
    for row in rows.values():
        assert all(finite(cell.split()[0].replace(",", "")) > 0 for cell in row[1:9])
        assert row[7] == "64"
    assert rows["uniform (TRL)"][10] == "8-8" and finite(rows["uniform (TRL)"][9]) == 0
    low, high = map(int, rows["knapsack"][10].split("-"))
    assert 2 <= low <= 8 <= high <= 32


def test_selective_rollout_table(sections):
    summary, curves = sections["selective_rollout"].split("Held-out accuracy over training")
    rows = {row[0]: row[1:] for row in table_rows(summary)}
    assert set(rows) == {"trl", "filter", "dynamic", "greso"}
    numbers = [cells[:5] + cells[6:] for cells in rows.values()]  # cells[5]: accuracy per seed, "a / b / c"
    assert all(finite(cell) >= 0 for cells in numbers for cell in cells)
    assert finite(rows["dynamic"][6]) == finite(rows["dynamic"][7]) == finite(rows["dynamic"][8]) == 1.0
    curve = {
        row[0]: [re.fullmatch(r"(\S+) \((\d+)\)", cell).groups() for cell in row[1:]]
        for row in table_rows(curves)
    }
    assert set(curve) == set(rows)
    for points in curve.values():  # --quick: the start and 2 epochs, generated rows so far never shrinking
        assert len(points) == 3 and points[0][1] == "0"
        assert all(0 <= finite(accuracy) <= 1 for accuracy, _ in points)
        assert [int(r) for _, r in points] == sorted(int(r) for _, r in points)


def test_hint_reach_tables(sections):
    """Per level, the base model's greedy accuracy with a hint of 0 .. level - 1 clauses and the share of answers first
    wrong at each clause (or all right): shares of one set of problems, summing to 1."""
    tables = sections["hint_reach"].split("\nlevel ")[1:]
    assert [table.split(":")[0] for table in tables] == ["1", "2", "3", "4"]
    for level, table in enumerate(tables, start=1):
        (row,) = table_rows(table)
        assert row[0] == "base" and len(row) == 1 + level + level + 1
        assert all(0 <= finite(cell) <= 1 for cell in row[1:])
        assert math.isclose(sum(finite(cell) for cell in row[1 + level :]), 1.0, abs_tol=0.02)


def test_pass_at_k_tables(sections):
    passes, budgets = sections["pass_at_k"].split("A group of b completions sees a right answer")
    pass_rows, budget_rows = table_rows(passes), table_rows(budgets)
    assert [row[0] for row in pass_rows] == [row[0] for row in budget_rows] == ["1", "2", "3", "4", "all"]
    for row in pass_rows:  # --quick: pass@1, pass@8, both outcomes in a group of 8, no right answer in 8
        assert len(row) == 5 and all(0 <= finite(cell) <= 1 for cell in row[1:])
        assert finite(row[1]) <= finite(row[2])
    for row in budget_rows:  # b = 2, 4, 8, then the budget that sees a right answer half the time
        assert len(row) == 5 and all(0 <= finite(cell) <= 1 for cell in row[1:4])
        assert [finite(c) for c in row[1:4]] == sorted(finite(c) for c in row[1:4])
