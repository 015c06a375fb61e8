"""A quiet console for training runs: one compact progress line per logged step, upstream noise filtered.

`use_compact_progress(trainer)` swaps the Trainer's `ProgressCallback` (which prints every metric dict,
~1,200 characters a step for GRPO) for one that prints `progress_line`: step, mean reward (± std), KL when
logged, the share of zero-signal groups and the step time. On a terminal that is `CompactProgress` (tqdm's bar
with the lines above it); when stdout is not a terminal (a log file, CI, nohup, a cluster job) it is
`LineProgress`, plain lines and no bar, since tqdm's carriage-return redraws would land inside the lines
(`plain_upstream_bars` turns off the bars transformers and datasets draw, e.g. while loading weights). `quiet_upstream_warnings()`
hides the FutureWarnings transformers raises about its own renamed internals (gradient_checkpointing ->
activation_checkpointing, triggered by TRL, not by the user) and TRL's out-of-range warning for the vLLM version grpo_hub
tests; warnings about the user's own settings stay.
"""

from __future__ import annotations

import sys
import warnings

from transformers.trainer_callback import ProgressCallback, TrainerCallback

# transformers' own deprecations of its internals ("`x` is deprecated and will be removed in v6. Use `y`"),
# raised from inside transformers when TRL calls the old names; nothing in the user's config triggers them.
UPSTREAM_DEPRECATION = r"`\w+` is deprecated and will be removed in v6"
# TRL 1.16 warns (at import, once per importing module) that vLLM is outside 0.22-0.31; grpo_hub pins and tests 0.32.
TESTED_VLLM_OUT_OF_RANGE = r"TRL currently supports vLLM versions from \S+ to \S+ You have version 0\.32\."


def progress_line(step: int, max_steps: int, logs: dict) -> str | None:
    """'step 12/30  reward 0.734 ±0.210  kl 0.0012  zero-signal 25%  0.93 s/step'; with hints also 'hinted 25% (right
    31% / unhinted 12%)' (the share of rows hinted, and the share right among hinted and unhinted rows); with asynchronous rollouts also
    'staleness 1.0  generation wait 0.01 s' (the trainer's wait for the server: for the batch, and before a weight
    sync for running requests). None for logs without a reward (the end-of-training summary)."""
    if "reward" not in logs:
        return None
    parts = [f"step {step}/{max_steps}", f"reward {logs['reward']:.3f}"]
    if "reward_std" in logs:
        parts[-1] += f" ±{logs['reward_std']:.3f}"
    if "kl" in logs:
        parts.append(f"kl {logs['kl']:.4f}")
    if "frac_reward_zero_std" in logs:
        parts.append(f"zero-signal {logs['frac_reward_zero_std']:.0%}")
    if (
        "hints/share_hinted" in logs
    ):  # hint-guided rollouts: the share hinted, and right answers with / without
        right = [
            f"{logs[k]:.0%}" if k in logs else "-" for k in ("hints/right_hinted", "hints/right_unhinted")
        ]
        parts.append(f"hinted {logs['hints/share_hinted']:.0%} (right {right[0]} / unhinted {right[1]})")
    if "async/staleness" in logs:  # asynchronous rollouts (max_staleness > 0)
        waited = logs.get("async/wait_seconds", 0.0) + logs.get("async/sync_wait_seconds", 0.0)
        parts.append(f"staleness {logs['async/staleness']:.1f}  generation wait {waited:.2f} s")
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


class LineProgress(TrainerCallback):
    """`progress_line` printed on its own line (flushed) at every logged step, with no progress bar."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            line = progress_line(state.global_step, state.max_steps, logs)
            if line is not None:
                print(line, flush=True)


def use_compact_progress(trainer, interactive: bool | None = None) -> None:
    """Replace `trainer`'s ProgressCallback (no-op when the progress bar is disabled) with CompactProgress when
    `interactive` (default: stdout is a terminal), else with LineProgress."""
    if interactive is None:
        interactive = sys.stdout.isatty()
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(CompactProgress if interactive else LineProgress)


def plain_upstream_bars() -> None:
    """Turn off the tqdm bars of transformers (weight loading), datasets and huggingface_hub; for a stdout that is not
    a terminal."""
    import datasets
    import huggingface_hub
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    huggingface_hub.utils.disable_progress_bars()


def quiet_upstream_warnings() -> None:
    """Hide transformers' FutureWarnings about its own renamed internals (see UPSTREAM_DEPRECATION) and TRL's
    warning about the vLLM version grpo_hub tests (`quiet_tested_vllm`)."""
    warnings.filterwarnings(
        "ignore", message=UPSTREAM_DEPRECATION, category=FutureWarning, module=r"transformers(\.|$)"
    )
    quiet_tested_vllm()


def quiet_tested_vllm() -> None:
    """Hide TRL's "supports vLLM 0.22.0 to 0.31.0, you have 0.32.x" warning: grpo_hub pins and tests vLLM 0.32 (any
    other version outside TRL's range still warns). `grpo_hub.training` calls it when imported, since TRL warns while
    its vLLM modules load."""
    warnings.filterwarnings("ignore", message=TESTED_VLLM_OUT_OF_RANGE, category=UserWarning)
