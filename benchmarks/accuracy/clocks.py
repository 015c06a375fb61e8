"""Time to accuracy on two clocks: the measured CPU clock and a GPU clock modeled from the counted work. Pure.

The GPU model prices a run's counted work with two per-unit costs:

    gpu_seconds = c_row * generated_rows + c_micro * micro_steps

calibrated on plain TRL so that its modeled time equals its measured CPU time and a share `share` of it is
generation: c_row = share * T / rows_trl, c_micro = (1 - share) * T / micro_steps_trl (T, rows_trl,
micro_steps_trl: plain TRL's totals, mean over seeds). The default share 0.90 is the H100 measurement of
../shared/DESIGN.md (Qwen2.5-0.5B, bf16, 64 rows x 256 tokens, HF generate: 6.4 s of a 7.1 s GRPO step; 0.92 in
`benchmarks.step_cost.scoring_forward` on an H100, 2026-11-26). A generated row, not a token, is the unit: HF
generate on a GPU is latency-bound and runs a batch until its longest completion ends, so a batch of shorter
completions costs the same (measured on an H100, docs/time-to-accuracy.md: priced per token, the model was
optimistic by up to 0.10 for runs with shorter completions; priced per row it is within 0.10 of every measured
ratio). At a fixed generation batch a row is a fixed share of a batch; a configuration that generates smaller
batches (selective_rollout_mode: shrink) is credited per row, which flatters it. An optimizer step is priced
as part of its micro-steps (a LoRA update is small next to a forward and backward on a GPU).

Reached (the smoothing rule of docs/time-to-accuracy.md): the first evaluation whose accuracy and the next one's
are both >= the target (the last evaluation counts alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GPU_GENERATION_SHARE = 0.90  # plain TRL's generation share of a GPU step (../shared/DESIGN.md, H100)
SENSITIVITY_SHARES = (0.70, 0.95)  # the shares the report also prices every run at
TARGET_FRACTIONS = (0.5, 0.75, 1.0)  # targets: plain TRL's mean accuracy at these fractions of its budget


@dataclass(frozen=True)
class UnitCosts:
    """Modeled GPU seconds per generated row and per training micro-step."""

    row: float
    micro_step: float

    def seconds(self, generated_rows: float, micro_steps: float) -> float:
        return self.row * generated_rows + self.micro_step * micro_steps


def calibrate(generated_rows: float, micro_steps: float, seconds: float, share: float) -> UnitCosts:
    """Unit costs under which a run that generated `generated_rows` and ran `micro_steps` costs `seconds`,
    `share` of them generating (0 < share < 1)."""
    if not 0 < share < 1:
        raise ValueError(f"share must lie in (0, 1), got {share!r}")
    return UnitCosts(share * seconds / generated_rows, (1 - share) * seconds / micro_steps)


def reached_at(times: list[float], accuracies: list[float], target: float) -> float | None:
    """Time of the first evaluation at or above `target` whose next one is too (the last: alone); None if never."""
    for i, value in enumerate(accuracies):
        if value >= target and (i == len(accuracies) - 1 or accuracies[i + 1] >= target):
            return times[i]
    return None


def time_ratio(mine: float | None, base: float | None) -> float | None:
    """A run's time to a target over plain TRL's: None if the run never reaches it; when plain TRL reaches it at
    the start (time 0), 1.0 if the run does too, else infinity (slower than an instant)."""
    if mine is None or base is None:
        return None
    if base == 0:
        return 1.0 if mine == 0 else math.inf
    return mine / base


def accuracy_at(times: list[float], accuracies: list[float], budget: float) -> float:
    """Accuracy of the evaluation closest to `budget` (the first of two equally close)."""
    return min(zip(times, accuracies, strict=True), key=lambda pair: abs(pair[0] - budget))[1]
