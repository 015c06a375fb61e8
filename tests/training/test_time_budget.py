"""time_budget_seconds (grpo_hub/training/time_budget.py) on the tiny model with a scripted clock: one second per
optimizer step plus a warm-up on the first, so the planned length and the learning rate of every step are known.
The rates are checked against the schedule formulas written out, not against transformers' scheduler."""

import functools
import itertools
import json
import math
import multiprocessing
import os
import shutil

import pytest
import torch

from grpo_hub.tasks import SMOKE_TASK, get_reward_funcs, load_task_dataset
from grpo_hub.training.time_budget import PLANNED_METRIC, STATE_FILE
from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import load_model, make_trainer, tiny_config
from tests.training.time_budget_helpers import CAP, LR, budget_trainer, logged, scripted_clock


def clock_at(*times: float):
    """Wall seconds read by the callback: `times[0]` at train begin, `times[s]` at the end of step s."""
    reads = iter(times)
    return lambda: next(reads)


def linear(step: int, total: int) -> float:
    return max(0.0, (total - step) / total)


def test_the_run_ends_its_linear_schedule_at_the_budget(tmp_path, tiny_model_dir):
    # step s ends at 3 + s seconds; pace after step 1: 1 s; budget 9.5 s: the last step that fits is 6 (9 s)
    trainer = budget_trainer(tmp_path, tiny_model_dir, scripted_clock())
    trainer.train()
    assert trainer.state.global_step == 6
    # steps 1-4 run on the upper bound's schedule (20 steps); the plan at step 4 (calibration) makes it 6 steps long
    expected = [LR * linear(s - 1, CAP) for s in range(1, 5)] + [LR * linear(s - 1, 6) for s in (5, 6)]
    assert logged(trainer, "learning_rate") == pytest.approx(expected, rel=1e-6)
    assert logged(trainer, PLANNED_METRIC) == [CAP, CAP, CAP, 6, 6, 6]


def test_warmup_and_cosine_are_rebuilt_for_the_planned_length(tmp_path, tiny_model_dir):
    trainer = budget_trainer(
        tmp_path,
        tiny_model_dir,
        scripted_clock(),
        lr_scheduler_type="cosine",
        warmup_steps=0.25,  # a fraction of the run: 5 of 20 steps, then 2 of the 6 planned
        time_budget_calibration_steps=2,
    )
    trainer.train()

    def cosine(step, total):
        warmup = math.ceil(0.25 * total)
        if step < warmup:
            return step / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    assert trainer.state.global_step == 6
    expected = [LR * cosine(0, CAP), LR * cosine(1, CAP)] + [LR * cosine(s - 1, 6) for s in range(3, 7)]
    assert logged(trainer, "learning_rate") == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_a_plan_that_ends_the_run_at_this_step_saves_and_evaluates_it(tmp_path, tiny_model_dir):
    # steps end at 4-7 s (the plan at step 4: 6 steps); step 5 takes 2 s: at 9 s the pace is 1.25 s and the 0.5 s
    # left fit no further step, so the plan ends the run at step 5, where neither a save nor an evaluation was due
    trainer = budget_trainer(
        tmp_path,
        tiny_model_dir,
        clock_at(0, 4, 5, 6, 7, 9),
        eval_dataset=load_task_dataset(SMOKE_TASK, n=8, seed=1),
        save_strategy="steps",
        save_steps=100,
        eval_strategy="steps",
        eval_steps=100,
    )
    trainer.train()
    assert trainer.state.global_step == 5
    # as at max_steps: the last step is saved and evaluated (outside the budget: the clock has no reading left)
    assert (tmp_path / "checkpoint-5" / "trainer_state.json").is_file()
    assert [entry["step"] for entry in trainer.state.log_history if "eval_loss" in entry] == [5]
    assert logged(trainer, PLANNED_METRIC) == [CAP, CAP, CAP, 6, 5]


def test_a_plan_that_grows_at_its_last_step_runs_the_steps_it_planned(tmp_path, tiny_model_dir):
    # the plan at steps 4 and 5: 6 steps; step 6 takes 0.2 s: at 8.2 s the pace is 0.84 s, and one more step fits
    trainer = budget_trainer(tmp_path, tiny_model_dir, clock_at(0, 4, 5, 6, 7, 8, 8.2, 9.2))
    trainer.train()
    assert trainer.state.global_step == 7
    assert logged(trainer, PLANNED_METRIC) == [CAP, CAP, CAP, 6, 6, 7, 7]
    expected = [LR * linear(s - 1, CAP) for s in range(1, 5)] + [LR * linear(s - 1, 6) for s in (5, 6)]
    assert logged(trainer, "learning_rate") == pytest.approx(expected + [LR * linear(6, 7)], rel=1e-6)


def test_fractional_save_eval_and_logging_steps_are_fractions_of_the_planned_length(tmp_path, tiny_model_dir):
    # the upper bound's quarter is 250 steps; the plan at step 4 is 17 steps (as in the slowest-rank test): 5 steps
    trainer = budget_trainer(
        tmp_path,
        tiny_model_dir,
        scripted_clock(),
        eval_dataset=load_task_dataset(SMOKE_TASK, n=8, seed=1),
        max_steps=1000,
        time_budget_seconds=20.0,
        save_strategy="steps",
        save_steps=0.25,
        eval_strategy="steps",
        eval_steps=0.25,
        logging_steps=0.25,
    )
    trainer.train()
    assert trainer.state.global_step == 17
    assert sorted(int(path.name.split("-")[1]) for path in tmp_path.glob("checkpoint-*")) == [5, 10, 15, 17]
    assert [entry["step"] for entry in trainer.state.log_history if "eval_loss" in entry] == [5, 10, 15, 17]
    assert [entry["step"] for entry in trainer.state.log_history if "loss" in entry] == [5, 10, 15]


def test_a_budget_that_fits_more_steps_keeps_the_upper_bound(tmp_path, tiny_model_dir):
    trainer = budget_trainer(
        tmp_path, tiny_model_dir, scripted_clock(), max_steps=5, time_budget_seconds=1000.0
    )
    trainer.train()
    assert trainer.state.global_step == 5
    assert logged(trainer, "learning_rate") == pytest.approx([LR * linear(s, 5) for s in range(5)], rel=1e-6)


def test_a_budget_spent_before_the_pace_is_known_stops_the_run(tmp_path, tiny_model_dir):
    trainer = budget_trainer(tmp_path, tiny_model_dir, scripted_clock(), time_budget_seconds=5.0)
    trainer.train()  # step 1 ends at 4 s, step 2 at 5 s: spent before the calibration step 4
    assert trainer.state.global_step == 2


def test_the_slowest_rank_sets_the_plan(tmp_path, tiny_model_dir):
    alone = budget_trainer(tmp_path / "alone", tiny_model_dir, scripted_clock(), time_budget_seconds=20.0)
    alone.train()  # step s ends at 3 + s s: pace 1 s, 13 more steps after step 4 (7 s)
    assert alone.state.global_step == 17
    trainer = budget_trainer(tmp_path, tiny_model_dir, scripted_clock(), time_budget_seconds=20.0)
    trainer._time_budget.reduce_max = lambda seconds: 2 * seconds  # another rank runs at half the speed
    trainer.train()  # there step s ends at 2 (3 + s) s: pace 2 s, 3 more steps after step 4 (14 s)
    assert trainer.state.global_step == 7


def summing_reduce(tensor, reduction="mean", scale=1.0):
    """accelerate <= 1.13's `reduce` (before PR #4027): a sum over the ranks for every reduction but "mean"."""
    total = tensor.clone()
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)
    return total / torch.distributed.get_world_size() if reduction == "mean" else total * scale


def rank_clock(trainer, store: str, rank: int, seconds: float, out: str) -> None:
    """A forked rank of a 2-rank gloo group: the max the callback reads over the ranks' `seconds`, written to `out`,
    with the trainer's accelerator reducing as accelerate <= 1.13 does."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    trainer.accelerator.reduce = summing_reduce
    result = trainer._time_budget.reduce_max(seconds)
    with open(out, "w") as file:
        json.dump(result, file)
    torch.distributed.destroy_process_group()
    os._exit(0)  # a forked pytest process must not run the parent's exit handlers


def test_the_slowest_rank_is_a_max_on_every_accelerate(tmp_path, tiny_model_dir):
    # accelerate <= 1.13 sums for reduction="max": 2 ranks at 1 s and 3 s would read 4 s, not 3 s
    trainer = budget_trainer(tmp_path, tiny_model_dir, scripted_clock())
    fork = multiprocessing.get_context("fork")
    ranks = [
        fork.Process(
            target=rank_clock, args=(trainer, tmp_path / "store", rank, seconds, tmp_path / f"{rank}.json")
        )
        for rank, seconds in enumerate([1.0, 3.0])
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
        assert process.exitcode == 0
    assert [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)] == [3.0, 3.0]


def test_a_resumed_run_counts_the_seconds_before_its_checkpoint(tmp_path, tiny_model_dir):
    full = budget_trainer(
        tmp_path / "full", tiny_model_dir, scripted_clock(), save_strategy="steps", save_steps=2
    )
    full.train()
    checkpoint = tmp_path / "full" / "checkpoint-4"
    saved = json.loads((checkpoint / STATE_FILE).read_text())
    assert saved == {"elapsed": 7.0, "warm_up_seconds": 4.0, "warm_up_steps": 1, "planned_steps": 6}
    # the resumed process has its own clock: 0 at train begin, 1 s per step (a warm-up of 0 s on its first)
    resumed = budget_trainer(tmp_path / "resumed", tiny_model_dir, lambda: next(ticks))
    ticks = itertools.count()
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 6  # 7 s + 1 s per step: steps 5 (8 s) and 6 (9 s) fit
    # its log history continues the checkpoint's: steps 1-4 as saved, then 5 and 6 on the same schedule
    assert logged(resumed, "learning_rate") == pytest.approx(logged(full, "learning_rate"), rel=1e-6)


def saved_run(tmp_path, model_dir) -> None:
    """The 6-step run of the budget, saved every 2 steps in `tmp_path` (the clock of `scripted_clock`)."""
    budget_trainer(tmp_path, model_dir, scripted_clock(), save_strategy="steps", save_steps=2).train()


def ticks():
    """A resumed or warm process's clock: 0 at train begin, 1 s more at the end of each step."""
    return functools.partial(next, itertools.count())


def test_a_resumed_process_leaves_its_own_warm_up_step_out_of_the_pace(tmp_path, tiny_model_dir):
    """A resumed process pays a warm-up on its first step too (its first generation, compilation), as step 1 did: the
    pace leaves both out, so the resumed run plans the steps that still fit at its steady 1 s a step."""
    saved_run(tmp_path / "full", tiny_model_dir)  # checkpoint-4: 7 s spent, step 1 4 s of it (3 s warm-up)
    resumed = budget_trainer(tmp_path / "resumed", tiny_model_dir, scripted_clock(), time_budget_seconds=20.0)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-4"))
    # step 5 ends at 7 + 4 = 11 s (warm-up again), each later step 1 s on: steps up to 14 (20 s) fit. Counting step
    # 5's warm-up in the pace (7 s over steps 2-5: 1.75 s a step) plans 10 steps at step 5 and stops at 13.
    plans = {
        entry["step"]: entry[PLANNED_METRIC] for entry in resumed.state.log_history if PLANNED_METRIC in entry
    }
    assert plans[5] == 14
    assert resumed.state.global_step == 14


def test_a_checkpoint_that_saved_step_ones_end_only_resumes_as_before(tmp_path, tiny_model_dir):
    """time_budget.json as saved before the resumed processes' warm-ups were counted ("first_step": the end of step 1,
    the one warm-up) still resumes: the same plan as from the current file."""
    saved_run(tmp_path / "full", tiny_model_dir)
    state = tmp_path / "full" / "checkpoint-4" / STATE_FILE
    state.write_text(json.dumps({"elapsed": 7.0, "first_step": 4.0, "planned_steps": 6}))
    resumed = budget_trainer(tmp_path / "resumed", tiny_model_dir, scripted_clock(), time_budget_seconds=20.0)
    resumed.train(resume_from_checkpoint=str(state.parent))
    assert (
        resumed.state.global_step == 14
    )  # as test_a_resumed_process_leaves_its_own_warm_up_step_out_of_the_pace


def test_a_second_train_starts_a_fresh_clock(tmp_path, tiny_model_dir):
    saved_run(tmp_path / "full", tiny_model_dir)
    trainer = budget_trainer(tmp_path / "again", tiny_model_dir, ticks())
    trainer.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-4"))  # 7 s spent before it
    assert trainer.state.global_step == 6
    trainer._time_budget.clock = ticks()
    trainer.train()  # step s ends at s seconds (no warm-up): pace 1 s, 5 more steps after step 4 (4 s)
    assert trainer.state.global_step == 9


def test_a_second_train_resumes_from_its_own_checkpoint(tmp_path, tiny_model_dir):
    saved_run(tmp_path / "full", tiny_model_dir)
    trainer = budget_trainer(tmp_path / "again", tiny_model_dir, ticks(), save_strategy="steps", save_steps=2)
    # the first call resumes at step 2 of the saved run (5 s spent) and saves at steps 4 and 6
    trainer.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    shutil.rmtree(tmp_path / "again" / "checkpoint-6")
    trainer._time_budget.clock = ticks()
    # the second resumes its own checkpoint-4 (7 s spent, 6 steps planned), not the first call's (5 s)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 6


def test_a_checkpoint_without_the_spent_seconds_is_refused(tmp_path, tiny_model_dir):
    first = make_trainer(
        GRPOHubTrainer,
        tiny_model_dir,
        tiny_config(tmp_path, max_steps=2, save_strategy="steps", save_steps=2),
    )
    first.train()
    resumed = budget_trainer(tmp_path, tiny_model_dir, scripted_clock(), max_steps=4)
    with pytest.raises(ValueError, match=f"`time_budget_seconds`: resuming at step 2, but no {STATE_FILE}"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


def test_a_scheduler_passed_to_the_trainer_is_refused(tmp_path, tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    trainer = GRPOHubTrainer(
        model=model,
        reward_funcs=get_reward_funcs(SMOKE_TASK),
        args=tiny_config(tmp_path, time_budget_seconds=60.0),
        train_dataset=load_task_dataset(SMOKE_TASK, n=16, seed=0),
        processing_class=tokenizer,
        optimizers=(optimizer, scheduler),
    )
    with pytest.raises(ValueError, match="`time_budget_seconds`: .*a scheduler passed to the trainer"):
        trainer.train()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"time_budget_seconds": 0.0}, "`time_budget_seconds`: must be > 0"),
        ({"time_budget_calibration_steps": 1}, "`time_budget_calibration_steps`: must be >= 2"),
        (
            {"lr_scheduler_type": "reduce_lr_on_plateau", "eval_strategy": "steps", "eval_steps": 1},
            "schedule by step",
        ),
    ],
)
def test_bad_settings_name_the_field(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(tmp_path, **{"time_budget_seconds": 60.0, **overrides})
