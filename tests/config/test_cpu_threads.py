"""A CPU-only single-process run trains on every core it may use unless the user chose a thread count; several
processes keep one thread each (issue 48, item 5)."""

import sys
from pathlib import Path

import pytest

from grpo_hub.config.cpu_threads import available_cores, thread_choice
from tests.recipes.helpers import launch
from tests.training.distributed.launch import launch_env, run_isolated

PROBE = Path(__file__).with_name("threads_probe.py")
LAUNCHED = {
    "ACCELERATE_DYNAMO_BACKEND": "NO",
    "OMP_NUM_THREADS": "1",
}  # what `accelerate launch` hands its child
ALL_CORES = "torch threads: 8 (all cores; set OMP_NUM_THREADS to choose)"


@pytest.mark.parametrize(
    ("env", "launcher", "processes", "expected"),
    [
        (LAUNCHED, ({}, ["accelerate", "launch", "x.py"]), 1, (8, ALL_CORES)),
        (LAUNCHED, ({"OMP_NUM_THREADS": "1"}, []), 1, (1, "torch threads: 1 (OMP_NUM_THREADS=1)")),
        (
            LAUNCHED,
            ({}, ["launch", "--num_cpu_threads_per_process=1"]),
            1,
            (1, "torch threads: 1 (OMP_NUM_THREADS=1)"),
        ),
        (
            LAUNCHED,
            (None, []),
            1,
            (1, "torch threads: 1 (OMP_NUM_THREADS=1)"),
        ),  # launcher unreadable: the user's
        (
            {"OMP_NUM_THREADS": "1"},
            ({}, ["bash"]),
            1,
            (1, "torch threads: 1 (OMP_NUM_THREADS=1)"),
        ),  # no accelerate
        ({}, ({}, ["bash"]), 1, (8, ALL_CORES)),
        (
            LAUNCHED,
            ({}, []),
            2,
            (1, "torch threads: 1 per process (2 processes; set OMP_NUM_THREADS to choose)"),
        ),
    ],
    ids=[
        "accelerate-default",
        "user-env",
        "user-flag",
        "unreadable",
        "plain-python-user",
        "plain-python",
        "2-ranks",
    ],
)
def test_thread_choice(env, launcher, processes, expected):
    assert thread_choice(env, launcher, cores=8, processes=processes, current=1) == expected


def probe(tmp_path, *launch_flags, omp=None) -> list[str]:
    """Lines printed by threads_probe.py under `accelerate launch` (OMP_NUM_THREADS=`omp` in its environment)."""
    env = {key: value for key, value in launch_env().items() if key != "OMP_NUM_THREADS"}
    env.update({"OMP_NUM_THREADS": omp} if omp else {})
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        "1",
        "--num_machines",
        "1",
    ]
    command += ["--mixed_precision", "no", "--dynamo_backend", "no", *launch_flags, str(PROBE)]
    return run_isolated(command, tmp_path, env, "threads probe").splitlines()[-2:]


def test_under_accelerate_launch_the_default_uses_every_core_and_a_user_count_is_kept(tmp_path):
    cores = available_cores()
    assert probe(tmp_path) == [
        f"torch threads: {cores} (all cores; set OMP_NUM_THREADS to choose)",
        f"threads now {cores}",
    ]
    assert probe(tmp_path, omp="1") == ["torch threads: 1 (OMP_NUM_THREADS=1)", "threads now 1"]
    flag = probe(tmp_path, "--num_cpu_threads_per_process", "1")
    assert flag == ["torch threads: 1 (OMP_NUM_THREADS=1)", "threads now 1"]


@pytest.mark.slow
def test_the_recipe_says_and_uses_its_thread_count(tmp_path):
    """The README's command with no thread setting: the run names its count before the first step and trains on it."""
    summary, _ = launch(tmp_path, "--task", "digits", "--max_steps", "2", env={"OMP_NUM_THREADS": None})
    lines = (tmp_path / "console.log").read_text().splitlines()
    said = f"torch threads: {available_cores()} (all cores; set OMP_NUM_THREADS to choose)"
    assert said in lines, lines
    first_step = next(i for i, line in enumerate(lines) if line.startswith("step "))
    assert lines.index(said) < first_step
    assert summary["torch_threads"] == available_cores()


@pytest.mark.slow
@pytest.mark.distributed
def test_two_cpu_ranks_keep_one_thread_each(tmp_path):
    """2 ranks on a machine of any size, no thread setting: one thread per rank, said once."""
    summary, _ = launch(
        tmp_path,
        "--task",
        "digits",
        "--max_steps",
        "2",
        accelerate_config="cpu-ddp.yaml",
        env={"OMP_NUM_THREADS": None},
    )
    lines = (tmp_path / "console.log").read_text().splitlines()
    said = [line for line in lines if line.startswith("torch threads:")]
    assert said == ["torch threads: 1 per process (2 processes; set OMP_NUM_THREADS to choose)"], said
    assert summary["world_size"] == 2 and summary["torch_threads"] == 1
