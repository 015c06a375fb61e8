"""What the vLLM workers record about where a run's IS ratio came from (generation/loss_time_is.py): the line the
trainer prints about it, the no-grad forwards of the policy outside generation (TRL's scoring forward; vLLM
generation, colocated or on a server, never runs `trainer.model`), and how many values of each IS metric one optimizer
step logged (one per generation batch).

A run's JSON may hold `trl_path: true`: the worker then calls `trainer._use_loss_time_is(False)` (TRL's scoring
forward computes the old log-probs: the baseline)."""

from __future__ import annotations

import contextlib
import io
import sys

from transformers import TrainerCallback

from tests.training.vllm_stand_in import ScoringForwards

PATH_PREFIX = "vLLM IS correction:"
IS_METRICS = ("sampling/importance_sampling_ratio/mean", "vllm_is/abs_logp_diff_mean")


class _Tee(io.TextIOBase):
    def __init__(self, stream):
        self.stream, self.text = stream, []

    def write(self, text):
        self.text.append(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


@contextlib.contextmanager
def printed_path_lines(into: list[str]):
    """Within it, stdout still prints, and the lines that start with PATH_PREFIX are appended to `into`."""
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        try:
            yield
        finally:
            lines = "".join(tee.text).splitlines()
            into.extend(line for line in lines if line.startswith(PATH_PREFIX))


class MetricValuesPerStep(TrainerCallback):
    """At each step's end, after grpo_hub's FlushCallback (added before it, so called before it) and before the step
    is logged: how many values of each of IS_METRICS the step holds (one per generation batch trained)."""

    def __init__(self, trainer):
        self.metrics, self.values = trainer._metrics["train"], {name: [] for name in IS_METRICS}

    def on_step_end(self, args, state, control, **kwargs):
        for name in IS_METRICS:
            self.values[name].append(len(self.metrics.get(name, ())))


def install(trainer, trl_path: bool) -> tuple[ScoringForwards, MetricValuesPerStep]:
    """`trl_path`: TRL's scoring forward (the baseline); then count scoring forwards and IS metric values per step."""
    if trl_path:
        trainer._use_loss_time_is(False)
    per_step = MetricValuesPerStep(trainer)
    trainer.add_callback(per_step)
    return ScoringForwards(trainer.model), per_step


def fields(lines: list[str], forwards: ScoringForwards, per_step: MetricValuesPerStep) -> dict:
    """The result fields: `is_path_lines`, `scoring_forwards`, `is_values_per_step` ({metric: [values per step]})."""
    return {"is_path_lines": lines, "scoring_forwards": forwards.count, "is_values_per_step": per_step.values}


def check_is_path(result: dict, *, loss_time: bool, batches_per_step: int = 1) -> None:
    """Assertions on a rank-0 result dict (test side): the printed path line (the trainer's default, loss time, in
    both), the scoring forwards (none on the loss-time path, one per trained generation batch of at most one micro-batch
    on TRL's), and IS_METRICS logged finite at every step, from `batches_per_step` generation batches each."""
    import math

    steps = result["global_step"]
    assert len(result["is_path_lines"]) == 1, result["is_path_lines"]
    assert "ratio from the training forward" in result["is_path_lines"][0]
    assert "no scoring forward" in result["is_path_lines"][0]
    if loss_time:
        assert result["scoring_forwards"] == 0
    else:
        assert result["scoring_forwards"] == steps * batches_per_step
    assert result["is_values_per_step"] == {name: [batches_per_step] * steps for name in IS_METRICS}
    logs = [entry for entry in result["log_history"] if "loss" in entry]
    assert len(logs) == steps
    for log in logs:
        assert all(math.isfinite(log[name]) for name in IS_METRICS), log
