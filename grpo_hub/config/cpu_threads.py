"""Torch threads of a CPU-only run: every core it may use, unless the user chose a count.

`accelerate launch` without a config hands its child `OMP_NUM_THREADS=1` whenever the user set none (its own
`accelerate/commands/launch.py`: the parent's value, else 1), so a single-process CPU run would train on one
thread whatever the machine. That default is told apart from a user's `OMP_NUM_THREADS=1` by the launcher
itself: it is accelerate's when accelerate's own environment had no `OMP_NUM_THREADS` and its command line no
`--num_cpu_threads_per_process`. Several processes keep their count (one thread each by default: they share the
cores).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

THREAD_VARIABLE = "OMP_NUM_THREADS"
THREAD_FLAGS = ("--num_cpu_threads_per_process", "--num-cpu-threads-per-process")
LAUNCH_MARK = "ACCELERATE_DYNAMO_BACKEND"  # set in the child by every `accelerate launch` launcher
CHOOSE = "set OMP_NUM_THREADS to choose"


def accelerate_default(
    env: Mapping[str, str], launcher_env: Mapping[str, str] | None, launcher_argv: Sequence[str]
) -> bool:
    """True when `env[OMP_NUM_THREADS]` is `accelerate launch`'s default, not the user's (an unreadable launcher
    counts as the user's choice)."""
    if LAUNCH_MARK not in env or launcher_env is None:
        return False
    flagged = any(arg.split("=", 1)[0] in THREAD_FLAGS for arg in launcher_argv)
    return THREAD_VARIABLE not in launcher_env and not flagged


def thread_choice(
    env: Mapping[str, str], launcher: tuple, cores: int, processes: int, current: int
) -> tuple[int, str]:
    """(torch threads, the line that says why) for a CPU-only run of `processes` processes on `cores` cores, now
    on `current` threads; `launcher` is (its environment or None, its argv)."""
    if processes > 1:
        return current, f"torch threads: {current} per process ({processes} processes; {CHOOSE})"
    if THREAD_VARIABLE in env and not accelerate_default(env, *launcher):
        return current, f"torch threads: {current} ({THREAD_VARIABLE}={env[THREAD_VARIABLE]})"
    return cores, f"torch threads: {cores} (all cores; {CHOOSE})"


def launcher_process() -> tuple[dict | None, list[str]]:
    """Environment and argv of the process that started this one; (None, []) when they cannot be read."""
    import psutil

    try:
        parent = psutil.Process().parent()
        return (parent.environ(), parent.cmdline()) if parent else (None, [])
    except psutil.Error:
        return None, []


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def use_machine_cores(processes: int) -> str:
    """Set torch's thread count of a CPU-only run of `processes` processes (`thread_choice`); return its line."""
    import torch

    threads, line = thread_choice(
        os.environ, launcher_process(), available_cores(), processes, torch.get_num_threads()
    )
    torch.set_num_threads(threads)
    return line


def use_cpu_cores(device_type: str) -> None:
    """A CPU-only run (`device_type` 'cpu') trains on every core it may use unless the user chose a thread count
    (`thread_choice`); the main process says which."""
    if device_type != "cpu":
        return
    from accelerate import PartialState

    state = PartialState()
    line = use_machine_cores(state.num_processes)
    if state.is_main_process:
        print(line, flush=True)
