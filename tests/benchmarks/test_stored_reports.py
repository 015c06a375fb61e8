"""Every stored time-to-accuracy measurement (docs/*.json) re-renders its report, and the JSON its `--json` writes, byte
for byte as the fixtures in `stored_reports/` hold them: NAME.txt the report; NAME.json the written file's summary and
the SHA-256 of the whole file (its runs are the stored ones, passed through).

The fixtures are the output of `render` as the benchmarks printed and wrote it before their shared harness was drawn out
of them (benchmarks/accuracy/tta_harness.py): a change to the harness that changes a report or a stored file
fails here. Never rewrite a fixture to make this test pass; a deliberate change of a report rewrites it in its
own commit, which says so.
"""

import hashlib
import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from benchmarks.accuracy import async_wall_clock as awc
from benchmarks.accuracy import clocks
from benchmarks.accuracy import time_to_accuracy as tta
from tests.conftest import REPO_ROOT

FIXTURES = Path(__file__).parent / "stored_reports"
# stored measurement -> the benchmark that renders it
STORED = {
    "async-wall-clock": "async_wall_clock",
    "async-wall-clock-equal-time": "async_wall_clock",
    "async-wall-clock-k0": "async_wall_clock",
    "async-wall-clock-padding-free": "async_wall_clock",
    "async-wall-clock-separation": "async_wall_clock",
    "async-wall-clock-time-budget": "async_wall_clock",
    "time-to-accuracy": "time_to_accuracy",
    "time-to-accuracy-gpu": "time_to_accuracy",
    "time-to-accuracy-knapsack": "time_to_accuracy",
    "time-to-accuracy-knapsack-preset": "time_to_accuracy",
    "time-to-accuracy-padding-free": "time_to_accuracy",
}


def render_async(stored: Path, written: Path) -> None:
    """What async_wall_clock prints and writes (`--json`) for the runs of `stored`: the summary at its stored GPU
    share, under its stored header (a partial file has neither: the defaults)."""
    part = json.loads(stored.read_text())
    share = part.get("summary", {}).get("gpu_share", clocks.GPU_GENERATION_SHARE)
    header = part.get("header", f"(partial measurement {stored.name})")
    summary = awc.summarize(part["runs"], share)
    written.write_text(json.dumps({"header": header, "runs": part["runs"], "summary": summary}, indent=1))
    awc.print_report(part["runs"], summary, header)


def render_tta(stored: Path, written: Path, monkeypatch) -> None:
    """`python -m benchmarks.accuracy.time_to_accuracy --merge STORED --json WRITTEN`: the report of
    docs/time-to-accuracy.md."""
    monkeypatch.setattr(sys, "argv", ["time_to_accuracy", "--merge", str(stored), "--json", str(written)])
    tta.main()


def render(name: str, written: Path, monkeypatch) -> str:
    """The report printed for the stored measurement `name` (and its JSON written to `written`)."""
    stored = REPO_ROOT / "docs" / f"{name}.json"
    out = io.StringIO()
    with redirect_stdout(out):
        if STORED[name] == "async_wall_clock":
            render_async(stored, written)
        else:
            render_tta(stored, written, monkeypatch)
    return out.getvalue()


@pytest.mark.parametrize("name", sorted(STORED))
def test_each_stored_measurement_renders_the_same_report_and_json(name, tmp_path, monkeypatch):
    written = tmp_path / "written.json"
    report = render(name, written, monkeypatch)
    assert report == (FIXTURES / f"{name}.txt").read_text()
    expected = json.loads((FIXTURES / f"{name}.json").read_text())
    assert json.loads(written.read_text())["summary"] == expected["summary"]
    assert hashlib.sha256(written.read_bytes()).hexdigest() == expected["sha256"]


def test_every_stored_measurement_has_its_fixture():
    stored = {
        path.stem
        for path in (REPO_ROOT / "docs").glob("*.json")
        if "accuracy" in path.stem or "clock" in path.stem
    }
    assert stored == set(STORED)
