"""The end-of-run summary a recipe prints and writes to `<output_dir>/run_summary.json`: steps, world size, the
mean reward of the first vs last logged steps, the zero-signal group shares and padding-free's pad share, times, where
the model was saved, and for a scored task the held-out accuracy before -> after."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import TrainerCallback

from grpo_hub.records.run_record import RUN_SUMMARY

SUMMARY_WINDOW = 5  # steps averaged at each end of the reward history
# logged shares averaged into the summary as mean_<last part of the key>, when logged
SHARES = ("zero_signal/frac_groups_all_max", "zero_signal/frac_groups_all_min", "padding_free/pad_share")


class RewardHistory(TrainerCallback):
    """Record the mean reward (and the logged `SHARES`) at every logging step (all ranks)."""

    def __init__(self):
        self.rewards: list[float] = []
        self.shares: dict[str, list[float]] = {key: [] for key in SHARES}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.rewards.append(float(logs["reward"]))
            for key, values in self.shares.items():
                if key in logs:
                    values.append(float(logs[key]))


def reward_trend(rewards: list[float], window: int = SUMMARY_WINDOW) -> tuple[float, float]:
    """Mean of the first and of the last `window` rewards (window shrinks to half the history if shorter)."""
    if not rewards:
        raise ValueError("no reward was logged; set --logging_steps to at most --max_steps")
    k = max(1, min(window, len(rewards) // 2))
    return sum(rewards[:k]) / k, sum(rewards[-k:]) / k


def summarize(
    trainer, history: RewardHistory, train_output, wall_seconds: float, model_name: str, task: str
) -> dict:
    """The summary of a finished `trainer.train()` (`train_output`) that took `wall_seconds` from launch."""
    import torch
    from accelerate.utils import is_peft_model

    first, last = reward_trend(history.rewards)
    return {
        "model": model_name,
        "task": task,
        "steps": trainer.state.global_step,
        "world_size": trainer.accelerator.num_processes,
        "torch_threads": torch.get_num_threads(),
        "peft": is_peft_model(trainer.model),
        "reward_first": round(first, 4),
        "reward_last": round(last, 4),
        "rewards": [round(r, 4) for r in history.rewards],
        **{
            f"mean_{key.split('/')[-1]}": round(sum(values) / len(values), 4)
            for key, values in history.shares.items()
            if values
        },
        "train_seconds": round(train_output.metrics["train_runtime"], 1),
        "wall_seconds": round(wall_seconds, 1),
        "saved_to": str(Path(trainer.args.output_dir).resolve()),
    }


def accuracy_line(before: dict, after: dict) -> str:
    """One clause per metric of a task's `evaluate`, e.g. "greedy: 1 0.30->0.50, ..., all 0.41->0.56"."""
    parts = []
    for metric, levels in before.items():
        pairs = ", ".join(f"{level} {levels[level]:.2f}->{after[metric][level]:.2f}" for level in levels)
        parts.append(f"{metric}: {pairs}")
    return "; ".join(parts)


def summary_lines(summary: dict, level_meaning: str | None = None) -> list[str]:
    """What the main process prints at the end: the run, the held-out accuracy (a scored task, per level =
    `level_meaning`, on `heldout_per_level` problems each where the run chose fewer than the task's all) and the final
    push."""
    lines = [
        f"GRPO done: {summary['steps']} steps on {summary['world_size']} process(es) in {summary['train_seconds']} s "
        f"({summary['wall_seconds']} s with engine set-up); "
        f"mean reward first {summary['reward_first']:.3f} -> last {summary['reward_last']:.3f}; "
        f"saved to {summary['saved_to']} (summary: {RUN_SUMMARY})"
    ]
    if "heldout_before" in summary:
        sample = f", {summary['heldout_per_level']} problems each" if "heldout_per_level" in summary else ""
        lines.append(
            f"held-out accuracy before -> after (per level = {level_meaning}{sample}): "
            + accuracy_line(summary["heldout_before"], summary["heldout_after"])
        )
    if "pushed" in summary:
        pushed = summary["pushed"]
        lines.append(
            f"pushed to the Hub: {pushed['repo_id']}@{pushed['revision']} (commit {pushed['commit_sha'][:7]}); "
            f"compare it: grpo-hub compare --adapters {pushed['repo_id']}@{pushed['revision']}"
        )
    return lines


def write_summary(output_dir: str, summary: dict) -> None:
    """`<output_dir>/run_summary.json` (the main process writes it)."""
    Path(output_dir, RUN_SUMMARY).write_text(json.dumps(summary, indent=2))
