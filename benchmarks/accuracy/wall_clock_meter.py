"""The meter of `benchmarks.accuracy.async_wall_clock`: a run's training wall clock with the evaluations taken
out, held-out accuracy at marks in optimizer steps or wall seconds, the work done, where the trainer's time
went (generating, waiting for generation, syncing weights, scoring, training) and the IS and staleness
diagnostics it logged.
"""

import statistics
import time
from collections import defaultdict

import torch
from transformers import TrainerCallback

from benchmarks.common import count_trained_rows
from grpo_hub.tasks import chain

# per-step logged diagnostics a run stores: name -> the trainer's metric (a tuple: the first one logged)
DIAGNOSTICS = {
    "staleness": ("async/staleness",),
    "is_weight_mean": ("sampling/importance_sampling_ratio/mean",),
    "is_share_outside": ("vllm_is/frac_truncated", "vllm_is/frac_masked"),
    "is_ess": ("vllm_is/ess",),
    "is_kl_k3": ("vllm_is/kl_k3",),
}


class Timers:
    """Wall seconds spent in wrapped calls of the training thread, by name; a wrapped call inside another one counts
    under its own name only (e.g. TRL's weight sync inside `_generate`)."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self._nested = []

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            self._nested.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                spent, inner = time.perf_counter() - start, self._nested.pop()
                self.seconds[name] += spent - inner
                if self._nested:
                    self._nested[-1] += spent

        return timed


class Meter(TrainerCallback):
    """The training wall clock (evaluations off it), held-out accuracy at `marks`, the work and the time split.

    `marks`: evenly spaced optimizer steps (`unit` "steps": plain TRL's run that sets the budget) or wall seconds;
    an evaluation runs at the first step end past each mark and at the last step, training stops past the last mark.
    Time split (Timers): "generate" (`_generate`: HF generate, or the server's answer in TRL's loop), "wait" (the
    asynchronous rollouts' pop and the sync's wait for running requests), "sync" (the weight sync itself);
    "engine": the server's seconds per asynchronous request (its own thread). The logged `async/wait_seconds` times
    the pop only: with the merged sync the trainer mostly waits inside the sync, for the batch in flight.
    """

    def __init__(
        self, tokenizer, marks: list[float], unit: str, per_level: int, deadline: float | None = None
    ):
        self.tokenizer, self.marks, self.unit, self.per_level = tokenizer, marks, unit, per_level
        # wall seconds (marks in steps): evaluate and stop at the first step end past it
        self.deadline = deadline
        self.timers, self.engine_seconds = Timers(), 0.0
        self.points, self.staleness, self.logged_wait, self.diagnostics = [], [], [], []
        self.tokens = self.trained_rows = 0
        self.trainer, self._start, self._paused = None, 0.0, 0.0

    def attach(self, trainer) -> None:
        """Count the trainer's generated tokens (`reward`) and trained rows, time its parts, receive its callbacks."""

        def count_rows(rows: int) -> None:
            self.trained_rows += rows

        count_trained_rows(trainer, count_rows)
        trainer._generate = self.timers.wrap("generate", trainer._generate)
        forward = trainer._get_per_token_logps_and_entropies
        scoring = self.timers.wrap(
            "scoring", forward
        )  # no-grad policy forwards: TRL's scoring (and reference) one
        trainer._get_per_token_logps_and_entropies = lambda *a, **k: (
            forward(*a, **k) if torch.is_grad_enabled() else scoring(*a, **k)
        )
        generation = getattr(trainer, "vllm_generation", None)
        if generation is not None:
            generation.sync_weights = self.timers.wrap("sync", generation.sync_weights)
            sync = generation.grpo_hub_sync
            sync.wait_idle = self.timers.wrap("wait", sync.wait_idle)
        rollouts = getattr(trainer, "_rollouts", None)
        if rollouts is not None:
            rollouts.pop = self.timers.wrap("wait", rollouts.pop)
            rollouts.client.generate = self._engine_timed(rollouts.client.generate)
        self.trainer = trainer
        trainer.add_callback(self)

    def _engine_timed(self, generate):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = generate(*args, **kwargs)
            self.engine_seconds += time.perf_counter() - start
            return out

        return timed

    def reward(self, prompts, completions, answer, completion_ids, **kwargs):
        """`chain_correctness_reward`, counting the generated tokens it scores."""
        self.tokens += sum(len(ids) for ids in completion_ids)
        return chain.chain_correctness_reward(prompts, completions, answer)

    def clock(self) -> float:
        """Wall seconds with the evaluations taken out (a run's time budget reads this clock)."""
        return time.perf_counter() - self._paused

    def elapsed(self) -> float:
        return self.clock() - self._start

    def _evaluate(self, model, step: int) -> None:
        rollouts = getattr(self.trainer, "_rollouts", None)
        if (
            rollouts is not None
        ):  # on the clock: the next step's sync would wait for the batch in flight anyway
            self.timers.wrap("wait", rollouts.wait_idle)()
        paused_at, elapsed = time.perf_counter(), self.elapsed()
        rng = torch.get_rng_state()  # the evaluation must not change the training's random stream
        accuracy = chain.evaluate(model, self.tokenizer, n=self.per_level)["greedy"]
        torch.set_rng_state(rng)
        model.train()
        self.points.append(
            {
                "time": round(elapsed, 2),
                "accuracy": accuracy,
                "optimizer_steps": step,
                "generated_tokens": self.tokens,
                "trained_rows": self.trained_rows,
            }
        )
        self._paused += time.perf_counter() - paused_at

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._start = time.perf_counter()
        self._evaluate(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        now = state.global_step if self.unit == "steps" else self.elapsed()
        crossed = bool(self.marks) and now >= self.marks[0]
        while self.marks and now >= self.marks[0]:
            self.marks.pop(0)
        late = self.deadline is not None and self.elapsed() >= self.deadline
        if crossed or late or state.global_step >= state.max_steps:
            self._evaluate(model, state.global_step)
        # the trainer's own stop (max_steps) stands; the meter only adds its own, past the last mark or the deadline
        control.should_training_stop = control.should_training_stop or not self.marks or late

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "async/staleness" in logs:
            self.staleness.append(logs["async/staleness"])
            self.logged_wait.append(logs["async/wait_seconds"])
        found = {}
        for name, keys in DIAGNOSTICS.items():
            key = next((k for k in keys if k in logs), None)
            if key is not None:
                found[name] = logs[key]
        if found:
            self.diagnostics.append({"step": state.global_step, **found})

    def record(self, name: str, seed: int, budget: float | None, schedule: str) -> dict:
        """The run: its evaluation points, budget, schedule ("steps": the recipe's 200; "time": its own length, set
        for the budget from stored step times; TIME_BUDGET: planned by time_budget_seconds), work, per-step diagnostics, and seconds per optimizer step of each part."""
        seconds, last = self.timers.seconds, self.points[-1]
        steps, wall = max(last["optimizer_steps"], 1), last["time"]
        blocked = seconds["generate"] + seconds["wait"]  # the trainer idle, waiting for generation
        engine = self.engine_seconds if name.startswith("server-async") else seconds["generate"]
        generation = getattr(self.trainer, "vllm_generation", None)
        sync = getattr(generation, "grpo_hub_sync", None)
        return {
            "config": name,
            "seed": seed,
            "schedule": schedule,
            "max_steps": self.trainer.args.max_steps,
            "planned_steps": self.trainer.state.max_steps,  # with time_budget_seconds: its last plan
            "evaluated_at": self.unit,  # "steps" or "seconds": where the evaluations sit
            "budget": wall if budget is None else budget,
            "points": self.points,
            "wall": wall,
            "optimizer_steps": last["optimizer_steps"],
            "generated_tokens": last["generated_tokens"],
            "trained_rows": last["trained_rows"],
            "mean_staleness": statistics.fmean(self.staleness) if self.staleness else 0.0,
            "mean_logged_wait": statistics.fmean(self.logged_wait) if self.logged_wait else None,
            "syncs": sync.syncs if sync else 0,
            "bytes_per_sync": sync.bytes_last_sync if sync else 0,
            "diagnostics": self.diagnostics,
            "per_step": {
                "generation": engine / steps,
                "blocked": blocked / steps,
                "sync": seconds["sync"] / steps,
                "scoring": seconds["scoring"] / steps,
                "training": (wall - blocked - seconds["sync"] - seconds["scoring"]) / steps,
            },
        }
