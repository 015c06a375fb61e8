"""benchmarks/accuracy/async_wall_clock.py, its pure parts: the two-device model, the report's arithmetic
against a naive computation (with the harness's accuracy per step and pairing by seed,
benchmarks/accuracy/tta_harness.py), nested call timing and when the meter evaluates and stops
(benchmarks/accuracy/wall_clock_meter.py; no vLLM, no wall-clock assertion)."""

import contextlib
import json
import random
import statistics
import time
from types import SimpleNamespace

import pytest

from benchmarks.accuracy import async_wall_clock as awc
from benchmarks.accuracy import tta_harness as harness
from benchmarks.accuracy import wall_clock_meter as wcm


def test_the_modeled_overlap_buys_at_most_one_over_the_larger_share():
    rng = random.Random(0)
    for _ in range(200):
        generation, training, share = rng.uniform(0.01, 5), rng.uniform(0.01, 5), rng.uniform(0.01, 0.99)
        assert awc.two_device_ratio(generation, training, 0.0, share) == pytest.approx(max(share, 1 - share))
        with_sync = awc.two_device_ratio(generation, training, rng.uniform(0.01, 1), share)
        assert max(share, 1 - share) < with_sync < 1
    # as measured: G = 0.4, T = 0.66, S = 0.04 -> (0.66 + 0.04) / 1.1
    assert awc.two_device_ratio(0.4, 0.66, 0.04, None) == pytest.approx(0.7 / 1.1)
    assert awc.two_device_ratio(1.0, 1.0, 0.0, 0.9) == pytest.approx(0.9)  # G rescaled to 9 x T


def test_a_call_inside_another_counts_under_its_own_name_only():
    timers = wcm.Timers()
    inner = timers.wrap("sync", lambda: time.sleep(0.02))

    def outer():
        time.sleep(0.01)
        inner()
        return "done"

    assert timers.wrap("generate", outer)() == "done"
    assert timers.seconds["sync"] >= 0.02 and 0.01 <= timers.seconds["generate"] < timers.seconds["sync"]
    with pytest.raises(ZeroDivisionError):  # an exception still closes the timing
        timers.wrap("sync", lambda: 1 / 0)()
    assert timers.wrap("generate", lambda: 7)() == 7


def point(t, accuracy, step=0):
    return {"time": t, "accuracy": {"all": accuracy}, "optimizer_steps": step}


def record(config, seed, times, accuracies, budget, per_step=None):
    return {
        "config": config,
        "seed": seed,
        "budget": budget,
        "points": [point(t, a) for t, a in zip(times, accuracies, strict=True)],
        "per_step": per_step or {"generation": 0.4, "training": 0.6, "sync": 0.05, "blocked": 0.4},
    }


def naive_first(times, accuracies, target):
    for i, a in enumerate(accuracies):
        if a >= target and (i + 1 == len(accuracies) or accuracies[i + 1] >= target):
            return times[i]
    return None


def test_summary_matches_a_naive_computation():
    rng = random.Random(3)
    runs = []
    for seed in range(3):
        budget = 100 + 10 * seed
        grid = [budget * k / 4 for k in range(5)]
        runs.append(
            record("trl", seed, grid, [0.3] + sorted(rng.uniform(0.3, 0.5) for _ in range(4)), budget)
        )
        fast = [t * 0.7 for t in grid] + [budget]  # reaches 200 steps early: its last point is at the end
        runs.append(
            record(
                "server-async", seed, fast, [0.3] + sorted(rng.uniform(0.3, 0.5) for _ in range(5)), budget
            )
        )
    summary = awc.summarize(runs, share=0.9)
    trl = [r for r in runs if r["config"] == "trl"]
    mean_times = [statistics.fmean(r["points"][i]["time"] for r in trl) for i in range(5)]
    mean_acc = [statistics.fmean(r["points"][i]["accuracy"]["all"] for r in trl) for i in range(5)]
    for fraction, index in (("0.5", 2), ("0.75", 3), ("1.0", 4)):
        target = mean_acc[index]
        assert summary["targets"][fraction] == pytest.approx(target)
        theirs = naive_first(mean_times, mean_acc, target)
        for name in ("trl", "server-async"):
            cell = summary["configs"][name][fraction]
            mine = [
                naive_first(
                    [p["time"] for p in r["points"]], [p["accuracy"]["all"] for p in r["points"]], target
                )
                for r in runs
                if r["config"] == name
            ]
            assert cell["time_to_target"] == mine and cell["trl_time_to_target"] == theirs
            ratios = [None if m is None else m / theirs for m in mine]
            assert cell["ratio_to_trl"] == pytest.approx(ratios)
            assert cell["median_ratio"] == (
                None if None in ratios else pytest.approx(statistics.median(ratios))
            )
    async_row = summary["configs"]["server-async"]
    assert async_row["accuracy_at_budget"] == async_row["final_accuracy"]  # its last point is at the budget
    modeled = async_row["modeled"][0]
    assert modeled["measured_share"] == pytest.approx(0.4)
    assert modeled["at_share"] == pytest.approx((5.4 + 0.05) / (5.4 + 0.6 + 0.05))


def test_a_budget_longer_than_plain_trls_200_steps_is_refused():
    runs = [record("trl", 0, [0, 5, 10], [0.3, 0.3, 0.3], 10), record("trl", 1, [0, 5], [0.3, 0.3], 10)]
    with pytest.raises(SystemExit, match="--budget"):
        awc.summarize(runs, share=0.9)


def test_the_meter_evaluates_past_each_mark_and_at_the_last_step_then_stops():
    meter = wcm.Meter(tokenizer=None, marks=[2.0, 4.0], unit="steps", per_level=1)
    evaluated = []
    meter._evaluate = lambda model, step: evaluated.append(step)
    control = SimpleNamespace(should_training_stop=False)
    for step in range(1, 6):
        meter.on_step_end(None, SimpleNamespace(global_step=step, max_steps=5), control)
        if control.should_training_stop:
            break
    assert evaluated == [2, 4] and step == 4
    meter = wcm.Meter(tokenizer=None, marks=[2.0, 40.0], unit="steps", per_level=1)
    meter._evaluate = lambda model, step: evaluated.append(step)
    for step in range(1, 6):  # max_steps ends the run before its last mark: evaluated there too
        meter.on_step_end(None, SimpleNamespace(global_step=step, max_steps=5), control)
    assert evaluated[2:] == [2, 5]


def test_marks_in_steps_with_a_deadline_evaluate_at_the_same_steps_and_stop_at_the_deadline():
    meter = wcm.Meter(tokenizer=None, marks=[2.0, 4.0, 6.0], unit="steps", per_level=1, deadline=10.0)
    evaluated, clock = [], iter([1.0, 3.0, 5.0, 11.0, 12.0])
    meter._evaluate = lambda model, step: evaluated.append(step)
    meter.elapsed = lambda: next(clock)
    control = SimpleNamespace(should_training_stop=False)
    for step in range(1, 7):
        meter.on_step_end(None, SimpleNamespace(global_step=step, max_steps=6), control)
        if control.should_training_stop:
            break
    assert evaluated == [2, 4] and step == 4  # step 4: a mark and past the deadline, evaluated once, stopped


def test_the_meter_never_overrides_the_trainers_stop_at_max_steps():
    """transformers' flow callback asks to stop at max_steps before the meter runs: marks left over must not undo it
    (they did: a 200-step job with marks in wall seconds trained on to the end of its data)."""
    meter = wcm.Meter(tokenizer=None, marks=[1000.0], unit="seconds", per_level=1)
    evaluated = []
    meter._evaluate = lambda model, step: evaluated.append(step)
    meter.elapsed = lambda: 1.0
    control = SimpleNamespace(should_training_stop=True)  # set by the flow callback at step == max_steps
    meter.on_step_end(None, SimpleNamespace(global_step=5, max_steps=5), control)
    assert control.should_training_stop and evaluated == [5]


def test_every_seed_starts_with_plain_trl_and_runs_each_configuration_once():
    order = harness.run_order(range(3), awc.CONFIGS)
    assert len(order) == len(set(order)) == 3 * len(awc.CONFIGS)
    for seed in range(3):
        names = [name for s, name in order if s == seed]
        assert names[0] == "trl" and sorted(names) == sorted(awc.CONFIGS)
    assert [s for s, _ in order] == sorted(s for s, _ in order)  # seed-major
    assert harness.run_order(range(2, 3), ["trl", "server-async"]) == [(2, "trl"), (2, "server-async")]
    assert harness.run_order(range(2), ["server-sync", "trl"]) == [
        (0, "trl"),
        (0, "server-sync"),
        (1, "trl"),
        (1, "server-sync"),
    ]


def test_a_resumed_measurement_keeps_its_runs_and_gives_the_rest_their_seeds_budget(monkeypatch, tmp_path):
    calls = []

    def fake_run(
        name, seed, budget, points, per_level, server_url, max_steps=None, step_marks=False, time_budget=False
    ):
        assert (
            max_steps is None and step_marks and not time_budget
        )  # equal steps: the recipe's schedule, evaluated at the same steps
        calls.append((seed, name, budget))
        wall = 300.0 + seed if name == "trl" else budget
        return {"config": name, "seed": seed, "budget": wall if budget is None else budget, "wall": wall,
                "optimizer_steps": 200, "points": [point(0, 0.3), point(wall, 0.4, 200)]}  # fmt: skip

    monkeypatch.setattr(awc, "run", fake_run)
    servers = []

    def fake_server(port, log_dir):
        servers.append(port)
        return contextlib.nullcontext(SimpleNamespace(base_url="u"))

    monkeypatch.setattr(awc, "local_server", fake_server)
    cli = SimpleNamespace(
        seeds=2,
        budget=None,
        points=4,
        per_level=1,
        json=str(tmp_path / "out.json"),
        configs=list(awc.CONFIGS),
        equal_time=None,
        time_budget=False,
        first_seed=0,
    )
    _, first = awc.measure(cli, [])
    assert [(s, n) for s, n, _ in calls] == harness.run_order(range(2), awc.CONFIGS)
    assert all(budget == (None if name == "trl" else 300.0 + seed) for seed, name, budget in calls)
    cut_short = [r for r in first if not (r["seed"] == 1 and r["config"] != "trl")]
    calls.clear()
    header, runs = awc.measure(cli, cut_short)
    assert [(s, n) for s, n, _ in calls] == [
        (1, name) for s, name in harness.run_order(range(2), awc.CONFIGS) if s == 1 and name != "trl"
    ]
    assert all(budget == 301.0 for *_, budget in calls)  # seed 1's kept plain-TRL run sets it
    assert [(r["seed"], r["config"]) for r in runs] == harness.run_order(range(2), awc.CONFIGS)
    assert all(kept in runs for kept in cut_short) and f"{len(cut_short)} runs kept" in header
    assert json.loads((tmp_path / "out.json").read_text())["runs"] == runs
    calls.clear()
    _, again = awc.measure(cli, runs)  # nothing left to run: the report only, no server started
    assert again == runs and not calls and len(servers) == 2


def naive_accuracy_at_step(steps, accuracies, step):
    if step > steps[-1]:
        return None
    i = max(k for k in range(len(steps)) if steps[k] <= step)
    if steps[i] == step or i + 1 == len(steps):
        return accuracies[i]
    fraction = (step - steps[i]) / (steps[i + 1] - steps[i])
    return accuracies[i] * (1 - fraction) + accuracies[i + 1] * fraction


def test_accuracy_per_step_interpolates_between_evaluations_like_a_naive_computation():
    rng = random.Random(5)
    for _ in range(300):
        steps = [0, *sorted(rng.sample(range(1, 220), rng.randint(1, 8)))]
        accuracies = [rng.uniform(0.2, 0.5) for _ in steps]
        points = [point(0.0, a, s) for s, a in zip(steps, accuracies, strict=True)]
        for step in (0, 50, 100, 150, 200, steps[-1], rng.randint(0, 230)):
            expected = naive_accuracy_at_step(steps, accuracies, step)
            got = harness.accuracy_at_step(points, step)
            assert got == (None if expected is None else pytest.approx(expected)), (steps, step)
    stalled = [point(0.0, 0.3, 0), point(1.0, 0.35, 100), point(2.0, 0.4, 100)]  # two evaluations at one step
    assert harness.accuracy_at_step(stalled, 100) == 0.35


def test_the_summary_compares_accuracy_per_step_and_marks_runs_that_stopped_early():
    full = [point(t, 0.3 + t / 1000, s) for t, s in [(0, 0), (100, 100), (200, 200)]]
    short = [point(t, 0.3 + t / 2000, s) for t, s in [(0, 0), (200, 120)]]
    runs = [{**record("trl", 0, [0, 100, 200], [0.3, 0.4, 0.5], 200), "points": full},
            {**record("server-sync", 0, [0, 200], [0.3, 0.4], 200), "points": short}]  # fmt: skip
    table = awc.summarize(runs, share=0.9)["configs"]
    assert table["trl"]["accuracy_at_steps"]["100"] == [pytest.approx(0.4)]
    assert table["server-sync"]["accuracy_at_steps"]["100"] == [pytest.approx(0.3 + 0.1 * 100 / 120)]
    assert table["server-sync"]["accuracy_at_steps"]["150"] == [None]
    assert list(table["trl"]["accuracy_at_steps"]) == [str(s) for s in awc.STEP_MARKS]


def test_equal_time_plans_each_configurations_steps_from_its_stored_step_time(monkeypatch, tmp_path):
    stored = [{"config": "trl", "seed": s, "wall": 400.0 + s, "optimizer_steps": 200, "budget": 400.0 + s,
               "points": [point(0, 0.3), point(400.0 + s, 0.4, 200)]} for s in range(2)]  # fmt: skip
    stored += [
        {"config": "server-async", "seed": s, "wall": w, "optimizer_steps": 200}
        for s, w in [(0, 240), (1, 280)]
    ]
    stored += [{"config": "server-async", "seed": 2, "wall": 90.0, "optimizer_steps": 50, "schedule": "time"}]
    assert awc.seconds_per_step(stored) == {"trl": pytest.approx(2.0025), "server-async": pytest.approx(1.3)}
    assert awc.planned_steps(401.0, 1.3) == 308 and awc.planned_steps(1.0, 5.0) == 1
    steps_json = tmp_path / "steps.json"
    steps_json.write_text(json.dumps({"runs": stored}))
    calls = []

    def fake_run(
        name, seed, budget, points, per_level, server_url, max_steps=None, step_marks=False, time_budget=False
    ):
        assert (
            not step_marks and not time_budget
        )  # equal time: evaluated at fractions of the budget, for the time to each target
        calls.append((seed, name, budget, max_steps))
        return {"config": name, "seed": seed, "budget": budget, "wall": budget, "optimizer_steps": max_steps,
                "schedule": "time", "points": [point(0, 0.3), point(budget, 0.4, max_steps)]}  # fmt: skip

    monkeypatch.setattr(awc, "run", fake_run)
    monkeypatch.setattr(
        awc, "local_server", lambda port, log_dir: contextlib.nullcontext(SimpleNamespace(base_url="u"))
    )
    cli = SimpleNamespace(seeds=2, budget=None, points=4, per_level=1, json=None,
                          configs=["trl", "server-async"], equal_time=str(steps_json), time_budget=False,
                          first_seed=0)  # fmt: skip
    header, runs = awc.measure(cli, stored)  # the stored equal-steps async runs are not kept: they are re-run
    assert calls == [(0, "server-async", 400.0, 307), (1, "server-async", 401.0, 308)]
    assert [r["config"] for r in runs] == ["trl", "server-async"] * 2 and "own schedule" in header
    cli.configs = ["trl", "server-sync"]
    with pytest.raises(SystemExit, match="server-sync"):  # no stored step time: refused, naming it
        awc.measure(cli, stored)


def test_time_budget_runs_let_the_setting_plan_for_plain_trls_wall_time(monkeypatch):
    stored = [{"config": "trl", "seed": 0, "wall": 400.0, "optimizer_steps": 200, "budget": 400.0,
               "points": [point(0, 0.3), point(400.0, 0.4, 200)]},
              {"config": "server-async", "seed": 0, "wall": 250.0, "optimizer_steps": 200, "schedule": "time"}]  # fmt: skip
    calls = []

    def fake_run(
        name, seed, budget, points, per_level, server_url, max_steps=None, step_marks=False, time_budget=False
    ):
        calls.append((seed, name, budget, max_steps, step_marks, time_budget))
        return {"config": name, "seed": seed, "budget": budget, "wall": 399.0, "optimizer_steps": 310,
                "schedule": awc.TIME_BUDGET, "points": [point(0, 0.3), point(399.0, 0.4, 310)]}  # fmt: skip

    monkeypatch.setattr(awc, "run", fake_run)
    monkeypatch.setattr(
        awc, "local_server", lambda port, log_dir: contextlib.nullcontext(SimpleNamespace(base_url="u"))
    )
    cli = SimpleNamespace(seeds=1, budget=None, points=4, per_level=1, json=None, configs=["trl", "server-async"],
                          equal_time=None, time_budget=True, first_seed=0)  # fmt: skip
    header, runs = awc.measure(
        cli, stored
    )  # the kept plain-TRL run sets the budget; the "time" run is re-run
    assert calls == [(0, "server-async", 400.0, None, False, True)]
    assert "planned by time_budget_seconds" in header
    _, again = awc.measure(cli, runs)  # a time-budget run is kept by a time-budget measurement
    assert again == runs and len(calls) == 1


def test_per_step_differences_are_paired_by_seed_like_a_naive_computation():
    rng = random.Random(2)
    trl, mine = [], []
    for seed in range(6):
        curve = [point(t, rng.uniform(0.2, 0.5), t) for t in (0, 100, 200)]
        trl.append({"seed": seed, "points": curve})
        if seed != 4:  # a seed this configuration lacks is left out of the pairing
            mine.append({"seed": seed, "points": [point(t, rng.uniform(0.2, 0.5), t) for t in (0, 100, 200)]})
    got = harness.paired_to_trl(trl, mine, 100)
    differences = [
        m["points"][1]["accuracy"]["all"] - trl[m["seed"]]["points"][1]["accuracy"]["all"] for m in mine
    ]
    assert got["n"] == 5 and got["mean"] == pytest.approx(statistics.fmean(differences))
    assert got["se"] == pytest.approx(statistics.stdev(differences) / 5**0.5)
    assert harness.paired_to_trl(trl, mine[:1], 100)["se"] is None


def test_the_meter_stores_every_steps_diagnostics_and_the_summary_averages_them():
    meter = wcm.Meter(tokenizer=None, marks=[], unit="steps", per_level=1)
    logs = [{"loss": 1.0, "async/staleness": 1.0, "async/wait_seconds": 0.1, "vllm_is/ess": 0.9,
             "vllm_is/frac_truncated": 0.01, "sampling/importance_sampling_ratio/mean": 1.0, "vllm_is/kl_k3": 1e-3},
            {"loss": 1.0}, {"vllm_is/ess": 0.7, "vllm_is/frac_masked": 0.03}]  # fmt: skip
    for step, log in enumerate(logs, 1):
        meter.on_log(None, SimpleNamespace(global_step=step), None, logs=log)
    assert meter.diagnostics == [
        {
            "step": 1,
            "staleness": 1.0,
            "is_weight_mean": 1.0,
            "is_share_outside": 0.01,
            "is_ess": 0.9,
            "is_kl_k3": 1e-3,
        },
        {"step": 3, "is_share_outside": 0.03, "is_ess": 0.7},
    ]
    means = awc.mean_diagnostics([{"diagnostics": meter.diagnostics}, {}])
    assert means["is_ess"] == pytest.approx(0.8) and means["staleness"] == 1.0
