"""benchmarks.accuracy.pass_at_k's figures from right counts (no sampling), its seed averaging, and the stored
measurement (docs/pass-at-k.json): its figures are what its counts give, and `--merge` re-renders it."""

import json
from pathlib import Path

import pytest

from benchmarks.accuracy import pass_at_k as bench
from grpo_hub.algos.pass_at_k import both_outcomes_in_group, pass_at_k
from tests.conftest import REPO_ROOT

STORED = REPO_ROOT / "docs" / "pass-at-k.json"


def test_level_figures_are_means_over_problems():
    counts = [0, 0, 1, 5, 64]
    figures = bench.level_figures(64, counts)
    assert figures["pass"]["1"] == pytest.approx(70 / 320)
    assert figures["pass"]["8"] == pytest.approx(sum(pass_at_k(64, c, 8) for c in counts) / 5)
    assert figures["no_right"] == pytest.approx(0.4)
    assert figures["both_outcomes"] == pytest.approx(
        sum(both_outcomes_in_group(64, c, 8) for c in counts) / 5
    )
    assert list(figures["budget_pass"]) == ["2", "4", "8", "16", "32", "64"]
    assert figures["budget_pass"]["64"] == pytest.approx(0.6)  # problems with any right sample


def test_half_budget_is_the_first_budget_reaching_one_half():
    assert bench.half_budget(64, [32]) == 1  # pass@1 = 32 / 64 = 0.5 exactly
    assert bench.half_budget(64, [64, 0]) == 1
    assert bench.half_budget(64, [0, 0, 1]) is None  # a third of the problems at most
    assert bench.half_budget(64, [1]) == 32  # 1 - C(63, b)/C(64, b) = b / 64


def test_short_runs_leave_out_the_larger_k():
    figures = bench.level_figures(8, [1, 2])
    assert list(figures["pass"]) == ["1", "8"]
    assert list(figures["budget_pass"]) == ["2", "4", "8"]
    assert bench.level_figures(4, [1])["both_outcomes"] is None  # a group of 8 cannot be drawn from 4


def run(counts: dict) -> dict:
    return {"samples": 64, "counts": counts, "levels": bench.summarize(64, counts)}


def test_runs_named_by_seed_are_averaged():
    models = {
        "base": run({"1": [3, 0]}),
        "uniform-s0": run({"1": [10, 0]}),
        "uniform-s1": run({"1": [20, 2]}),
        "knapsack-s0": run({"1": [0, 0]}),
    }
    groups = bench.groups(models)
    assert set(groups) == {"uniform", "knapsack"}
    assert groups["uniform"]["runs"] == ["uniform-s0", "uniform-s1"]
    level = groups["uniform"]["levels"]["1"]
    assert level["pass"]["8"] == pytest.approx(
        (models["uniform-s0"]["levels"]["1"]["pass"]["8"] + models["uniform-s1"]["levels"]["1"]["pass"]["8"])
        / 2
    )
    assert level["no_right"] == pytest.approx(0.25)
    assert level["half_budget"] == bench.half_budget(64, [10, 0, 20, 2])
    assert groups["knapsack"]["levels"]["all"]["half_budget"] is None


@pytest.mark.skipif(not STORED.exists(), reason="no stored measurement yet")
def test_stored_figures_are_what_their_counts_give(tmp_path, capsys):
    stored = json.loads(STORED.read_text())
    for run in stored["models"].values():
        assert run["levels"] == bench.summarize(run["samples"], run["counts"])
    written = Path(tmp_path) / "merged.json"
    assert bench.main(["--merge", str(STORED), "--json", str(written)]) == 0
    assert json.loads(written.read_text()) == stored
    assert "## base (the shipped model" in capsys.readouterr().out
