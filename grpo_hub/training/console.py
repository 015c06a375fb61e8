"""A quiet console for training runs: one compact progress line per logged step, upstream noise filtered.

`use_compact_progress(trainer)` swaps the Trainer's `ProgressCallback` (which prints every metric dict,
~1,200 characters a step for GRPO) for `CompactProgress`, which prints `progress_line`: step, mean reward
(± std), KL when logged, the share of zero-signal groups and the step time. `quiet_upstream_warnings()`
hides the FutureWarnings transformers raises about its own renamed internals (gradient_checkpointing ->
activation_checkpointing, triggered by TRL, not by the user); warnings about the user's own settings stay.
"""

from __future__ import annotations

import warnings

from transformers.trainer_callback import ProgressCallback

# transformers' own deprecations of its internals ("`x` is deprecated and will be removed in v6. Use `y`"),
# raised from inside transformers when TRL calls the old names; nothing in the user's config triggers them.
UPSTREAM_DEPRECATION = r"`\w+` is deprecated and will be removed in v6"


def progress_line(step: int, max_steps: int, logs: dict) -> str | None:
    """'step 12/30  reward 0.734 ±0.210  kl 0.0012  zero-signal 25%  0.93 s/step'; None for logs without a
    reward (the end-of-training summary)."""
    if "reward" not in logs:
        return None
    parts = [f"step {step}/{max_steps}", f"reward {logs['reward']:.3f}"]
    if "reward_std" in logs:
        parts[-1] += f" ±{logs['reward_std']:.3f}"
    if "kl" in logs:
        parts.append(f"kl {logs['kl']:.4f}")
    if "frac_reward_zero_std" in logs:
        parts.append(f"zero-signal {logs['frac_reward_zero_std']:.0%}")
    if "step_time" in logs:
        parts.append(f"{logs['step_time']:.2f} s/step")
    return "  ".join(parts)


class CompactProgress(ProgressCallback):
    """The Trainer's progress bar, writing `progress_line` instead of the whole metric dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            line = progress_line(state.global_step, state.max_steps, logs)
            if line is not None:
                self.training_bar.write(line)


def use_compact_progress(trainer) -> None:
    """Replace `trainer`'s ProgressCallback with CompactProgress (no-op when the progress bar is disabled)."""
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(CompactProgress)


def quiet_upstream_warnings() -> None:
    """Hide transformers' FutureWarnings about its own renamed internals (see UPSTREAM_DEPRECATION)."""
    warnings.filterwarnings(
        "ignore", message=UPSTREAM_DEPRECATION, category=FutureWarning, module=r"transformers(\.|$)"
    )
