"""Datasets and rewards for the distributed workers: the built-in task, and crafted zero-signal batches.

With `shuffle_dataset=False`, TRL's RepeatSampler walks the prompts in order and accelerate hands each
rank a contiguous slice of every generation batch: with `prompts_per_rank` prompts per rank and 2 ranks,
rank 0 gets prompts [0, p), rank 1 gets [p, 2p), then rank 0 [2p, 3p), ... . The crafted scenarios put a
"flat" prompt (constant reward, so zero-signal) at every rank-1 position and a "live" prompt at every
rank-0 position:
- "rank1-flat": live reward = visible length of the completion / 100 (varies within almost every group);
- "task-rank1-flat": live reward = the built-in task's reward (logged as `rewards/task_on_live/mean`);
- "all-flat": every prompt flat;
- "half-flat": every other prompt flat on both ranks (each rank keeps half of its rows), live as in "rank1-flat".
Each rank records which kinds it scored, so the tests check that the layout really landed as intended.
"""

from __future__ import annotations

from collections import Counter

from grpo_hub.tasks import SMOKE_TASK, get_reward_funcs, load_task_dataset

SCENARIOS = ("task", "rank1-flat", "task-rank1-flat", "all-flat", "half-flat")
FLAT_REWARD = 0.5


def _kind(scenario: str, index: int, prompts_per_rank: int) -> str:
    if scenario == "all-flat":
        return "flat"
    if scenario == "half-flat":
        return "flat" if index % 2 else "live"
    on_rank1 = (index // prompts_per_rank) % 2 == 1
    return "flat" if on_rank1 else "live"


def build_dataset(scenario: str, n_prompts: int, prompts_per_rank: int, seed: int):
    """The task dataset; for the crafted scenarios with a "kind" column ("live" or "flat")."""
    dataset = load_task_dataset(SMOKE_TASK, n=n_prompts, seed=seed)
    if scenario == "task":
        return dataset
    kinds = [_kind(scenario, i, prompts_per_rank) for i in range(n_prompts)]
    return dataset.add_column("kind", kinds)


def build_rewards(scenario: str, scored: Counter):
    """Reward functions for `scenario`; every call counts the kinds this rank scored into `scored`."""
    task_reward = get_reward_funcs(SMOKE_TASK)[0]
    if scenario == "task":

        def counted_task_reward(prompts, completions, **kwargs):
            scored["task"] += len(completions)
            return task_reward(prompts, completions, **kwargs)

        return [counted_task_reward]

    def flat_constant(prompts, completions, kind, **kwargs):
        """Flat rows: a constant; live rows: None (scored by the other function)."""
        scored.update(kind)
        return [FLAT_REWARD if row_kind == "flat" else None for row_kind in kind]

    def live_length(prompts, completions, kind, **kwargs):
        """Live rows: visible length / 100 (varies within a group); flat rows: None."""
        return [
            len("".join(text.split())) / 100 if k == "live" else None
            for text, k in zip(completions, kind, strict=True)
        ]

    def task_on_live(prompts, completions, kind, **kwargs):
        """Live rows: the built-in task's reward; flat rows: None."""
        rewards = task_reward(prompts, completions, **kwargs)
        return [reward if k == "live" else None for reward, k in zip(rewards, kind, strict=True)]

    return [flat_constant, task_on_live if scenario == "task-rank1-flat" else live_length]
