"""benchmarks/accuracy/time_to_accuracy.py, accuracy_summary.py, clocks.py and the chain testbed
(benchmarks/chain_testbed.py): the smoothing rule, the GPU calibration, the summary's ratios on both clocks against
a naive computation, and a short run's evaluation points."""

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import chain_testbed as testbed
from benchmarks.accuracy import accuracy_summary, clocks
from benchmarks.accuracy import time_to_accuracy as tta


def points(accuracies, step=10.0):
    return [{"time": i * step, "accuracy": {"all": a}} for i, a in enumerate(accuracies)]


def test_a_crossing_counts_only_when_the_next_evaluation_holds_it():
    def reached(accuracies, target):
        return clocks.reached_at([10.0 * i for i in range(len(accuracies))], accuracies, target)

    assert reached([0.3, 0.52, 0.48, 0.51, 0.53], 0.5) == 30.0  # 0.52 alone is noise
    assert reached([0.3, 0.4, 0.5], 0.5) == 20.0  # the last point counts alone
    assert reached([0.3, 0.6, 0.5], 0.5) == 10.0  # "at or above" the target
    assert reached([0.3, 0.6, 0.4], 0.5) is None
    assert reached([0.6, 0.6, 0.4], 0.5) == 0.0  # reached at the start


def test_a_target_reached_at_the_start_is_not_never():
    assert clocks.time_ratio(0.0, 0.0) == 1.0 and clocks.time_ratio(20.0, 0.0) == math.inf
    assert clocks.time_ratio(0.0, 20.0) == 0.0 and clocks.time_ratio(None, 0.0) is None


def test_the_gpu_calibration_gives_plain_trl_its_time_and_generation_share():
    rng = random.Random(0)
    for _ in range(100):
        rows, micro, seconds, share = (
            rng.uniform(1e2, 1e5),
            rng.randint(1, 500),
            rng.uniform(1, 500),
            rng.random(),
        )
        costs = clocks.calibrate(rows, micro, seconds, share)
        assert costs.seconds(rows, micro) == pytest.approx(seconds)
        assert costs.row * rows / seconds == pytest.approx(share)
    with pytest.raises(ValueError, match="share"):
        clocks.calibrate(1.0, 1, 1.0, 1.0)


def naive_gpu_times(run, trl_runs, share):
    rows = sum(r[-1]["generated_rows"] for r in trl_runs) / len(trl_runs)
    micro = sum(r[-1]["micro_steps"] for r in trl_runs) / len(trl_runs)
    seconds = sum(r[-1]["time"] for r in trl_runs) / len(trl_runs)
    return [
        share * seconds * p["generated_rows"] / rows + (1 - share) * seconds * p["micro_steps"] / micro
        for p in run
    ]


def naive_ratios(results, clock, fraction, share):
    """Per config, per seed: time to plain TRL's mean accuracy at `fraction` of its budget, over the time of TRL's
    mean curve."""
    trl = results["trl"]
    index = round(fraction * (len(trl[0]) - 1))
    target = sum(r[index]["accuracy"]["all"] for r in trl) / len(trl)

    def first(run):
        times = [p["time"] for p in run] if clock == "cpu" else naive_gpu_times(run, trl, share)
        acc = [p["accuracy"]["all"] for p in run]
        hits = [
            t for i, t in enumerate(times) if acc[i] >= target and (i + 1 == len(acc) or acc[i + 1] >= target)
        ]
        return hits[0] if hits else None

    mean_run = [
        {
            "time": sum(r[i]["time"] for r in trl) / len(trl),
            "accuracy": {"all": sum(r[i]["accuracy"]["all"] for r in trl) / len(trl)},
            "generated_rows": sum(r[i]["generated_rows"] for r in trl) / len(trl),
            "micro_steps": sum(r[i]["micro_steps"] for r in trl) / len(trl),
        }
        for i in range(len(trl[0]))
    ]
    theirs = first(
        mean_run
    )  # plain TRL's mean curve (the GPU time is linear in the counts: the mean of its times)
    out = {}
    for name, seeds in results.items():
        out[name] = []
        for run in seeds:
            mine = first(run)
            out[name].append(
                None if mine is None else (mine / theirs if theirs else (1.0 if mine == 0 else math.inf))
            )
    return out


def synthetic_results(rng: random.Random) -> dict:
    """3 seeds of plain TRL and of a faster and a slower configuration: random rising curves, work linear in time."""

    def run(accuracies, rows_per_second):
        return [
            {
                "time": 10.0 * i,
                "accuracy": {"all": a},
                "generated_tokens": 100 * 10 * i,  # tokens do not enter the GPU clock
                "generated_rows": rows_per_second * 10 * i,
                "trained_rows": 3 * i,
                "micro_steps": 2 * i,
                "optimizer_steps": i,
                "generation_seconds": 3.0 * i + 0.1,
                "all_correct": 0.0,
                "all_wrong": 0.5,
            }
            for i, a in enumerate(accuracies)
        ]

    def curve():
        return [0.3] + sorted(rng.uniform(0.3, 0.6) for _ in range(8))

    return {
        name: [run(curve(), rate) for _ in range(3)]
        for name, rate in (("trl", 4), ("fast", 2.4), ("slow", 7.2))
    }


def test_summary_ratios_match_a_naive_computation_on_both_clocks():
    results = synthetic_results(random.Random(1))
    for share in (0.7, 0.9):
        summary = accuracy_summary.summarize(results, budget=80.0, share=share)
        for clock in ("cpu", "gpu"):
            for fraction in clocks.TARGET_FRACTIONS:
                expected = naive_ratios(results, clock, fraction, share)
                for name in results:
                    got = summary["configs"][name][clock][str(fraction)]["ratio_to_trl"]
                    assert got == pytest.approx(expected[name]), (share, clock, fraction, name)
    row = accuracy_summary.summarize(results, budget=80.0)["configs"]["trl"]
    # the mean curve reaches its own final mean at the end
    assert row["cpu"]["1.0"]["trl_time_to_target"] == 80.0
    assert row["cpu"]["accuracy_at_budget"] == row["final_accuracy"]


def test_the_clock_check_finds_the_largest_gap_between_the_modeled_and_measured_ratios(capsys):
    """Against the naive ratios: every seed's ratio that both clocks reach, and the largest gap, at each share."""
    for seed in range(5):
        results = synthetic_results(random.Random(seed))
        for share in (0.6, 0.9):
            gaps = accuracy_summary.clock_gaps(accuracy_summary.summarize(results, budget=80.0, share=share))
            expected = []
            for fraction in clocks.TARGET_FRACTIONS:
                cpu, gpu = (naive_ratios(results, clock, fraction, share) for clock in ("cpu", "gpu"))
                for name in results:
                    expected += [abs(b - a) for a, b in zip(cpu[name], gpu[name], strict=True)
                                 if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]  # fmt: skip
            assert sorted(g["gap"] for g in gaps) == pytest.approx(sorted(expected))
            assert gaps[0]["gap"] == max(g["gap"] for g in gaps)
    accuracy_summary.print_clock_check(results, 80.0, seeds=[7, 8, 9])
    lines = capsys.readouterr().out.splitlines()[2:]  # after a blank line and the heading
    assert [line.split(" share ")[0] for line in lines] == [
        "- at the model's",
        "- at plain TRL's measured",
        "- at the best of 50-99 %",
    ]
    best_share = lines[2].split(" share ")[1].split("%")[0]
    largest = {  # the best share's largest gap is the smallest over the grid
        share: accuracy_summary.clock_gaps(accuracy_summary.summarize(results, 80.0, share))[0]["gap"]
        for share in accuracy_summary.SHARE_GRID
    }
    assert largest[int(best_share) / 100] == min(largest.values())
    assert f"largest gap {min(largest.values()):.3f}" in lines[2]
    assert all(any(f"seed {seed}:" in line for seed in (7, 8, 9)) for line in lines)  # the seeds' own numbers


def test_only_a_gpu_run_prints_the_clock_check(tmp_path, monkeypatch, capsys):
    results = synthetic_results(random.Random(2))
    for device, printed in (("cpu", False), ("NVIDIA H100 80GB HBM3", True)):
        stored = tmp_path / f"{device}.json"
        record = {**tta.run_record(80.0, 8, 10, [0, 1, 2], {"trl": None}, device="cpu"), "device": device}
        stored.write_text(
            json.dumps({"run": {**record, "configs": {n: {} for n in results}}, "points": results})
        )
        monkeypatch.setattr("sys.argv", ["time_to_accuracy", "--merge", str(stored)])
        tta.main()
        assert ("Modeled against measured clock" in capsys.readouterr().out) is printed, device


@pytest.fixture
def one_thread():
    """One torch thread, as the benchmark runs (`measure`): a step's CPU seconds without a second thread's spinning."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_a_short_run_records_every_evaluation_point_and_the_work(one_thread):
    settings, _ = testbed.recipe_settings(tta.RECIPE)
    # grid points 4 s apart, about twice a step's CPU seconds: a step that passed two at once would evaluate once
    recorded = tta.run("trl", 0, budget=8.0, points=2, extra=None, per_level=5)
    assert len(recorded) == 3 and recorded[0]["time"] == 0 and recorded[0]["optimizer_steps"] == 0
    assert recorded[1]["time"] >= 4.0 and recorded[2]["time"] >= 8.0
    last = recorded[-1]
    assert last["generated_rows"] == last["optimizer_steps"] * settings["per_device_train_batch_size"]
    assert last["trained_rows"] == last["generated_rows"] and last["micro_steps"] >= last["optimizer_steps"]
    assert 0 < last["generation_seconds"] < last["time"] and last["generated_tokens"] > last["generated_rows"]
    for point in recorded[1:]:
        assert 0 <= point["all_correct"] + point["all_wrong"] <= 1
    # a GPU clock that runs 3x slower than the CPU clock: the run goes on until it too has passed the budget,
    # evaluating at each of its grid points as well
    per_second = last["generated_rows"] / last["time"], last["micro_steps"] / last["time"]
    slow_gpu = clocks.calibrate(per_second[0], per_second[1], 1 / 3, 0.9)
    recorded = tta.run("trl", 0, budget=4.0, points=2, extra=None, per_level=5, costs=slow_gpu)
    gpu = accuracy_summary.clock_times(recorded, "gpu", slow_gpu)
    assert gpu[-1] >= 4.0 and gpu[-2] < 4.0 and recorded[-1]["time"] >= 8.0
    assert len(recorded) >= 4 and any(2.0 <= t < 4.0 for t in gpu)


@pytest.mark.slow
def test_trained_rows_are_the_batchs_rows_when_padding_free_packs_them_into_fewer(one_thread):
    settings, _ = testbed.recipe_settings(tta.RECIPE)
    recorded = tta.run("padding-free", 0, budget=1.0, points=1, extra={"padding_free": True}, per_level=2)
    last = recorded[-1]
    assert last["optimizer_steps"] >= 1 and last["micro_steps"] >= last["optimizer_steps"]
    assert (
        last["trained_rows"]
        == last["generated_rows"]
        == last["optimizer_steps"] * settings["per_device_train_batch_size"]
    )


def test_the_preset_runs_its_own_fields_over_the_testbeds(tmp_path):
    fields, _ = testbed.recipe_settings(tta.RECIPE)
    preset, _ = testbed.recipe_settings(tta.PRESET)
    common = {**fields, "output_dir": str(tmp_path), "use_cpu": True}
    common.pop("num_prompts")
    changed = tta.configurations()["preset"]
    assert fields["padding_free"] is False and changed["padding_free"] is True  # a field both files set
    args = tta.training_args(common, changed)
    assert all(getattr(args, k) == v for k, v in preset.items() if k not in ("num_prompts", "report_to"))
    plain = tta.training_args(common, None)
    assert type(plain).__name__ == "GRPOConfig" and not hasattr(plain, "padding_free")


def _stored(tmp_path, label, seeds, points_by_config, **changes) -> str:
    """A --json file as the benchmark writes it: the run record of `seeds` and its configurations, and the points."""
    import json

    configs = {name: {} if name == "trl" else {"filter_zero_signal": True} for name in points_by_config}
    record = {**tta.run_record(10.0, 4, 5, seeds, configs), **changes}
    (tmp_path / f"{label}.json").write_text(json.dumps({"run": record, "points": points_by_config}))
    return str(tmp_path / f"{label}.json")


def test_merge_puts_seeds_side_by_side_and_a_later_file_replaces_a_configurations_runs(tmp_path):
    def part(label, name, seeds, accuracies):
        runs = {"trl": [points([0.3, a]) for a in accuracies], "fast": [points([0.3, 0.1]) for _ in seeds]}
        runs = runs if name == "both" else {"fast": [points([0.3, a + 0.2]) for a in accuracies]}
        return _stored(tmp_path, label, seeds, runs)

    first = part("a", "both", [0, 2], [0.4, 0.5])
    second = part("b", "both", [1], [0.45])
    rerun = part("c", "fast only", [2, 0, 1], [0.1, 0.2, 0.3])
    record, results = tta.merge([first, second, rerun])
    assert (
        record["budget"] == 10.0
        and record["seeds"] == [0, 1, 2]
        and set(record["configs"]) == {"trl", "fast"}
    )
    assert [runs[-1]["accuracy"]["all"] for runs in results["trl"]] == [0.4, 0.45, 0.5]
    assert [runs[-1]["accuracy"]["all"] for runs in results["fast"]] == pytest.approx([0.4, 0.5, 0.3])
    assert "seeds [0, 1, 2]" in tta.describe(record) and tta.describe(record).count("seeds") == 1


def test_merge_keeps_the_preset_file_of_the_files_that_ran_it(tmp_path):
    runs = {"trl": [points([0.3, 0.4])]}
    plain = _stored(tmp_path, "a", [0], runs)
    with_preset = _stored(tmp_path, "b", [1], {**runs, "preset": [points([0.3, 0.5])]})
    for order in ([plain, with_preset], [with_preset, plain]):
        record, _ = tta.merge(order)
        assert record["preset_file"] == tta.PRESET and set(record["configs"]) == {"trl", "preset"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"budget": 20.0}, "has budget 20.0"),
        ({"model_build": "0123456789"}, "has model_build '0123456789'"),
        ({"device": "NVIDIA H100 80GB HBM3"}, "has device 'NVIDIA H100 80GB HBM3'"),
        ({"recipe_settings": {"learning_rate": 1.0}}, "has recipe_settings"),
        ({"configs": {"trl": {}, "fast": {"dynamic_sampling": True}}}, "configuration 'fast' is"),
    ],
)
def test_merge_refuses_files_of_another_testbed_or_configuration_in_one_line(tmp_path, changes, message):
    runs = {"trl": [points([0.3, 0.4])], "fast": [points([0.3, 0.4])]}
    first, other = _stored(tmp_path, "a", [0], runs), _stored(tmp_path, "b", [1], runs, **changes)
    with pytest.raises(SystemExit, match=message) as stop:
        tta.merge([first, other])
    assert "\n" not in str(stop.value.code)


def test_a_record_from_before_the_device_key_is_a_cpu_run_and_gpu_runs_name_their_clock(tmp_path):
    runs = {"trl": [points([0.3, 0.4])]}
    old = _stored(tmp_path, "old", [0], runs)
    record = json.loads(Path(old).read_text())
    del record["run"]["device"]
    Path(old).write_text(json.dumps(record))
    merged, _ = tta.merge([old, _stored(tmp_path, "new", [1], runs)])
    assert (
        merged["device"] == "cpu"
        and tta.measured_clock(merged) == "CPU"
        and "on one core" in tta.describe(merged)
    )
    with pytest.raises(SystemExit, match="has device 'NVIDIA H100 80GB HBM3'"):
        tta.merge([old, _stored(tmp_path, "gpu", [1], runs, device="NVIDIA H100 80GB HBM3")])
    gpu = {**merged, "device": "NVIDIA H100 80GB HBM3"}
    assert tta.measured_clock(gpu) == "GPU wall (NVIDIA H100 80GB HBM3)"
    assert "of NVIDIA H100 80GB HBM3 wall time" in tta.describe(gpu)


def test_the_stored_run_describes_itself():
    """docs/time-to-accuracy.json names its seeds once, and each configuration it ran with its settings."""
    import json

    stored = json.loads((Path(tta.__file__).parents[2] / "docs" / "time-to-accuracy.json").read_text())
    record = stored["run"]
    assert (
        set(record["configs"]) == set(stored["points"]) and "header" not in stored and "seeds" not in stored
    )
    assert all(len(runs) == len(record["seeds"]) for runs in stored["points"].values())
    for name, settings in record["configs"].items():
        assert settings == (tta.CONFIGS[name] or {}), name
    assert record["recipe_settings"] == testbed.recipe_settings(tta.RECIPE)[0]


def test_a_run_is_sampled_at_the_cpu_grid_with_row_weighted_group_shares():
    run = [
        {"time": 0.0, "accuracy": {"all": 0.1}, "generated_rows": 0, "all_correct": 0.0, "all_wrong": 0.0},
        {"time": 9.0, "accuracy": {"all": 0.2}, "generated_rows": 10, "all_correct": 0.5, "all_wrong": 0.5},
        {"time": 11.0, "accuracy": {"all": 0.3}, "generated_rows": 40, "all_correct": 0.0, "all_wrong": 1.0},
        {"time": 21.0, "accuracy": {"all": 0.4}, "generated_rows": 50, "all_correct": 1.0, "all_wrong": 0.0},
    ]
    grid = accuracy_summary.on_grid(run, budget=20.0, points=2)
    assert [g["time"] for g in grid] == [0.0, 10.0, 20.0]
    assert [g["accuracy"] for g in grid] == [0.1, 0.2, 0.4]  # closest evaluation; 9 s and 11 s tie: the first
    assert grid[1]["all_correct"] == pytest.approx(
        (0.5 * 10 + 0.0 * 30) / 40
    )  # 9 s and 11 s are nearest to 10
    assert grid[1]["all_wrong"] == pytest.approx((0.5 * 10 + 1.0 * 30) / 40)
    assert grid[2]["all_correct"] == 1.0 and grid[0]["all_wrong"] == 0.0


def test_the_group_shares_follow_the_trainers_ragged_groups_under_rollout_budget(monkeypatch):
    rewards = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]  # as groups of 2 and 6: all correct, then mixed
    monkeypatch.setattr(tta.chain, "chain_correctness_reward", lambda prompts, completions, answer: rewards)
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=None, _generate=None, add_callback=lambda callback: None,
        _budgets=SimpleNamespace(sizes=[2, 6]),
    )  # fmt: skip
    meter = tta.Meter(tokenizer=None, budget=1.0, points=4, group_size=4, per_level=1)
    meter.attach(trainer)
    meter.reward(["p"] * 8, ["c"] * 8, ["a"] * 8, completion_ids=[[1]] * 8)
    assert meter.groups == {"all_correct": 1, "all_wrong": 0, "total": 2}
