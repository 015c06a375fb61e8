"""Hint-guided rollouts: which prompts start from the first steps of their reference solution, and how long that
start is. Pure Python (math): imports neither trl nor transformers.

A hint is the first k steps of a prompt's reference solution, written as the beginning of the model's own answer;
the model continues from it, and only what it writes is trained (the hint is context). Sources:
- QuestA (Li et al. 2025, arXiv:2507.13266): a partial solution added to hard problems, then shortened (50 %, then
  25 %); evaluated without hints.
- POPE (arXiv:2601.18779): problems with no success in many samples start from the shortest prefix of the reference
  that the model then completes; the reference is never a training target.
- R3, reverse curriculum (Xi et al. 2024, arXiv:2402.05808): the start state slides from the end of a demonstration
  back to its beginning as the model succeeds.
- G2RPO-A (arXiv:2508.13023): the guidance length follows the running accuracy (fixed lengths help little).

The rule here (`next_hint_length`, decided on windows of completions: `windowed_hint_length`): a prompt (or a group
of prompts sharing a state, e.g. one difficulty level) starts unhinted; when none of a window's completions is right
its hint grows a step (the model cannot reach an answer from there: POPE), when at least `shorten_at` of them are
right it shrinks a step (R3). A hint never holds the whole
solution (`longest_hint`), and a run-level ceiling (`hint_ceiling`) takes every hint to zero by the end of the share
of the run the user sets (QuestA's shortening, spread over the run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def solution_steps(solution, separator: str) -> list[str]:
    """The steps of a reference solution: a list of strings as given, or a string split at `separator` (steps that
    are empty after splitting, e.g. from a trailing separator, are dropped). ValueError on anything else."""
    if isinstance(solution, str):
        return [step for step in solution.split(separator) if step.strip()]
    if isinstance(solution, (list, tuple)) and all(isinstance(step, str) for step in solution):
        return [step for step in solution if step.strip()]
    raise ValueError(f"a solution is a string or a list of strings, got {type(solution).__name__}")


def longest_hint(steps: int) -> int:
    """The most steps a hint of a `steps`-step solution may hold: all but the last, so the model always writes the
    step that reaches the answer (0 for a one-step solution: it is never hinted)."""
    return max(steps - 1, 0)


def hint_text(steps: Sequence[str], length: int, separator: str) -> str:
    """The first `length` steps, each followed by `separator` (so the model writes the next step): "" for 0.
    ValueError when `length` is negative or above `longest_hint`."""
    if not 0 <= length <= longest_hint(len(steps)):
        raise ValueError(
            f"a hint of a {len(steps)}-step solution holds 0..{longest_hint(len(steps))} steps, got {length}"
        )
    return "".join(step + separator for step in steps[:length])


def hint_ceiling(steps: int, progress: float, end: float | None) -> int:
    """The longest hint allowed at `progress` (share of the run's steps done, 0..1) when every hint must be gone by
    `end` (0 < end <= 1): ceil((1 - progress / end) * longest_hint(steps)), clipped to [0, longest_hint(steps)]. It
    falls linearly, a step at a time, to 0 at `end` (QuestA's shortening, spread over the run). `end` None: no
    run-level ceiling, `longest_hint(steps)` throughout."""
    if end is None:
        return longest_hint(steps)
    if not 0 < end <= 1:
        raise ValueError(f"end must lie in (0, 1], got {end!r}")
    left = max(0.0, 1.0 - progress / end)
    return min(longest_hint(steps), max(0, math.ceil(left * longest_hint(steps) - 1e-9)))


def windowed_hint_length(
    length: int, right: int, scored: int, window: int, shorten_at: float, most: int
) -> tuple[int, int, int]:
    """(length, right, scored) after a state's completions at `length` have added up to `right` of `scored`: once at
    least `window` are scored, the length is decided (`next_hint_length`) and the counts start again; before, nothing
    changes. A decision on a window, not on each batch, keeps a state that succeeds often from being hinted after
    one unlucky batch (8 completions at a success rate of 1/4 are all wrong one time in 10; 32 one time in 10,000)."""
    if scored < window:
        return length, right, scored
    return next_hint_length(length, right, scored, shorten_at, most), 0, 0


def next_hint_length(used: int, right: int, scored: int, shorten_at: float, most: int) -> int:
    """The state's next hint length after completions that started from `used` steps: `right` of `scored` were right.
    None right: one step longer (up to `most`), as the model could not reach an answer from there (POPE); a share of
    at least `shorten_at` right: one step shorter (down to 0), as the model now succeeds from there (R3); otherwise
    unchanged. With nothing scored the length stays."""
    if not 0 <= right <= scored:
        raise ValueError(f"right must lie in 0..scored, got right={right}, scored={scored}")
    if scored == 0:
        return used
    if right == 0:
        return min(used + 1, most)
    if right / scored >= shorten_at:
        return max(used - 1, 0)
    return used
