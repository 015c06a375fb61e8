"""benchmarks/time_to_accuracy.py: the smoothing rule, the summary's ratios, and a short run's evaluation points."""

import pytest

from benchmarks import time_to_accuracy as tta


def points(accuracies, step=10.0):
    return [{"time": i * step, "accuracy": {"all": a}} for i, a in enumerate(accuracies)]


def test_a_crossing_counts_only_when_the_next_evaluation_holds_it():
    assert tta.reached_at(points([0.3, 0.52, 0.48, 0.51, 0.53]), 0.5) == 30.0  # 0.52 alone is noise
    assert tta.reached_at(points([0.3, 0.4, 0.5]), 0.5) == 20.0  # the last point counts alone
    assert tta.reached_at(points([0.3, 0.6, 0.5]), 0.5) == 10.0  # "at or above" the target
    assert tta.reached_at(points([0.3, 0.6, 0.4]), 0.5) is None


def naive_summary(results):
    target = sum(runs[-1]["accuracy"]["all"] for runs in results["trl"]) / len(results["trl"])
    ratios = {}
    for name, seeds in results.items():
        ratios[name] = []
        for runs, base in zip(seeds, results["trl"], strict=True):
            mine = next(
                (p["time"] for i, p in enumerate(runs) if p["accuracy"]["all"] >= target
                 and (i + 1 == len(runs) or runs[i + 1]["accuracy"]["all"] >= target)),
                None,
            )  # fmt: skip
            theirs = next(
                p["time"] for i, p in enumerate(base) if p["accuracy"]["all"] >= target
                and (i + 1 == len(base) or base[i + 1]["accuracy"]["all"] >= target)
            )  # fmt: skip
            ratios[name].append(None if mine is None else mine / theirs)
    return target, ratios


def test_summary_ratios_match_a_naive_computation():
    work = {
        "generated_tokens": 5,
        "generated_rows": 4,
        "trained_rows": 3,
        "micro_steps": 2,
        "optimizer_steps": 1,
    }
    work["generation_seconds"] = 1.0

    def run(accuracies):
        return [{**p, **work} for p in points(accuracies)]

    results = {
        "trl": [run([0.3, 0.4, 0.5, 0.6]), run([0.3, 0.5, 0.55, 0.6])],
        "fast": [run([0.3, 0.6, 0.6, 0.7]), run([0.3, 0.4, 0.6, 0.65])],
        "slow": [run([0.3, 0.3, 0.4, 0.5]), run([0.3, 0.6, 0.7, 0.7])],
    }
    summary = tta.summarize(results)
    target, ratios = naive_summary(results)
    assert summary["target"] == pytest.approx(target)
    for name in results:
        assert summary["configs"][name]["ratio_to_trl"] == pytest.approx(ratios[name])
    assert summary["configs"]["fast"]["median_ratio"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert summary["configs"]["slow"]["median_ratio"] is None  # one seed never reaches the target


@pytest.mark.slow
def test_a_short_run_records_every_evaluation_point_and_the_work():
    settings, _ = tta.recipe_settings(tta.RECIPE)
    recorded = tta.run("trl", 0, budget=4.0, points=2, extra=None, per_level=5)
    assert len(recorded) == 3 and recorded[0]["time"] == 0 and recorded[0]["optimizer_steps"] == 0
    assert recorded[1]["time"] >= 2.0 and recorded[2]["time"] >= 4.0
    last = recorded[-1]
    assert last["generated_rows"] == last["optimizer_steps"] * settings["per_device_train_batch_size"]
    assert last["trained_rows"] == last["generated_rows"] and last["micro_steps"] >= last["optimizer_steps"]
    assert 0 < last["generation_seconds"] < last["time"] and last["generated_tokens"] > last["generated_rows"]
    for point in recorded[1:]:
        assert 0 <= point["all_correct"] + point["all_wrong"] <= 1


def test_merge_puts_seeds_side_by_side_and_a_later_file_replaces_a_configurations_runs(tmp_path):
    import json

    def part(name, seeds, accuracies, header):
        runs = {"trl": [points([0.3, a]) for a in accuracies], "fast": [points([0.3, 0.1]) for _ in seeds]}
        runs = runs if name == "both" else {"fast": [points([0.3, a + 0.2]) for a in accuracies]}
        (tmp_path / f"{header}.json").write_text(
            json.dumps({"header": header, "seeds": seeds, "points": runs})
        )
        return str(tmp_path / f"{header}.json")

    first = part("both", [0, 2], [0.4, 0.5], "a")
    second = part("both", [1], [0.45], "b")
    rerun = part("fast only", [2, 0, 1], [0.1, 0.2, 0.3], "c")
    header, seeds, results = tta.merge([first, second, rerun])
    assert header == "a + b + c" and seeds == [0, 1, 2]
    assert [runs[-1]["accuracy"]["all"] for runs in results["trl"]] == [0.4, 0.45, 0.5]
    assert [runs[-1]["accuracy"]["all"] for runs in results["fast"]] == pytest.approx([0.4, 0.5, 0.3])
