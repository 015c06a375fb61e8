"""The compact console: one progress line per logged step instead of the metric dict; upstream noise hidden."""

import warnings

from grpo_hub.records.console import (
    CompactProgress,
    LineProgress,
    progress_line,
    quiet_upstream_warnings,
    use_compact_progress,
)
from tests.conftest import RUN_LIMIT_S


class Trainer:
    """The two Trainer methods use_compact_progress calls, over a real CallbackHandler with TRL's ProgressCallback."""

    def __init__(self):
        from transformers.trainer_callback import CallbackHandler, ProgressCallback

        self.callback_handler = CallbackHandler([ProgressCallback()], None, None, None, None)

    def pop_callback(self, callback):
        return self.callback_handler.pop_callback(callback)

    def add_callback(self, callback):
        self.callback_handler.add_callback(callback)


def test_progress_line_names_reward_kl_zero_signal_and_step_time():
    logs = {
        "reward": 0.7342,
        "reward_std": 0.21,
        "kl": 0.00123,
        "frac_reward_zero_std": 0.25,
        "step_time": 0.931,
    }
    assert progress_line(12, 30, logs | {"completions/mean_length": 15.0}) == (
        "step 12/30  reward 0.734 ±0.210  kl 0.0012  zero-signal 25%  0.93 s/step"
    )
    assert progress_line(30, 30, {"train_runtime": 27.9, "train_loss": 0.1}) is None


def test_with_asynchronous_rollouts_the_line_shows_staleness_and_the_wait_for_generation():
    logs = {
        "reward": 0.5,
        "async/staleness": 1.0,
        "async/wait_seconds": 0.012,
        "async/sync_wait_seconds": 0.3,
    }
    assert progress_line(3, 9, logs | {"step_time": 0.8}) == (
        "step 3/9  reward 0.500  staleness 1.0  generation wait 0.31 s  0.80 s/step"
    )
    assert progress_line(3, 9, {"reward": 0.5, "async/staleness": 0.0, "async/wait_seconds": 0.25}).endswith(
        "staleness 0.0  generation wait 0.25 s"
    )


def test_trls_warning_about_the_tested_vllm_is_hidden_once_grpo_hub_training_is_imported():
    """TRL warns while its vLLM modules load, before a recipe's own filters: importing grpo_hub.training hides it."""
    import subprocess
    import sys

    warn = (
        "import warnings, grpo_hub.training\n"
        "for version in ('0.32.0', '0.32.1', '0.33.0'):\n"
        "    warnings.warn(f'TRL currently supports vLLM versions from 0.22.0 to 0.31.0. You have version {version} '\n"
        "                  'installed. We recommend installing a supported version.', stacklevel=1)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", warn], capture_output=True, text=True, timeout=RUN_LIMIT_S
    )
    assert done.returncode == 0, done.stderr
    assert "You have version 0.33.0" in done.stderr and "0.32." not in done.stderr


def test_compact_progress_replaces_the_trainer_progress_callback(tmp_path):
    from transformers import TrainerCallback

    trainer = Trainer()
    use_compact_progress(trainer, interactive=True)
    kinds = [type(c) for c in trainer.callback_handler.callbacks]
    assert kinds == [CompactProgress] and issubclass(CompactProgress, TrainerCallback)


def test_only_transformers_own_renames_are_hidden():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_upstream_warnings()
        upstream = "`gradient_checkpointing` is deprecated and will be removed in v6. Use `activation_checkpointing` instead."
        warnings.warn_explicit(
            upstream, FutureWarning, "training_args.py", 1, module="transformers.training_args"
        )
        warnings.warn_explicit(upstream, FutureWarning, "recipe.py", 1, module="user_code")
        warnings.warn_explicit("`beta` is odd", UserWarning, "training_args.py", 1, module="transformers.x")
    assert [str(w.message)[:14] for w in seen] == ["`gradient_chec", "`beta` is odd"]


def test_without_a_terminal_the_progress_is_plain_lines(capsys):
    from transformers import TrainerControl, TrainerState

    trainer = Trainer()
    use_compact_progress(trainer, interactive=False)
    (callback,) = trainer.callback_handler.callbacks
    assert isinstance(callback, LineProgress)
    state = TrainerState(global_step=2, max_steps=3)
    callback.on_train_begin(None, state, TrainerControl())
    callback.on_log(None, state, TrainerControl(), logs={"reward": 0.5, "step_time": 0.25})
    callback.on_log(None, state, TrainerControl(), logs={"train_runtime": 1.0})
    assert capsys.readouterr().out == "step 2/3  reward 0.500  0.25 s/step\n"
    interactive = Trainer()
    use_compact_progress(interactive, interactive=True)
    assert [type(c) for c in interactive.callback_handler.callbacks] == [CompactProgress]
