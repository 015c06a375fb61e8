"""Datasets and rewards for the distributed workers: the built-in task, and crafted zero-signal batches.

With `shuffle_dataset=False`, TRL's RepeatSampler walks the prompts in order and accelerate hands each
rank a contiguous slice of every generation batch: with `prompts_per_rank` prompts per rank and 2 ranks,
rank 0 gets prompts [0, p), rank 1 gets [p, 2p), then rank 0 [2p, 3p), ... . "rank1-flat" places a
"flat" prompt (constant reward, so zero-signal) at every rank-1 position and a "live" prompt (reward
that varies within a group) at every rank-0 position; "all-flat" makes every prompt flat. Each rank
records which kinds it scored, so the test checks that the layout really landed as intended.
"""

from __future__ import annotations

from collections import Counter

from grpo_hub.tasks import DEFAULT_TASK, get_reward_funcs, load_task_dataset

SCENARIOS = ("task", "rank1-flat", "all-flat")
FLAT_REWARD = 0.5


def _kind(scenario: str, index: int, prompts_per_rank: int) -> str:
    if scenario == "all-flat":
        return "flat"
    on_rank1 = (index // prompts_per_rank) % 2 == 1
    return "flat" if on_rank1 else "live"


def build_dataset(scenario: str, n_prompts: int, prompts_per_rank: int, seed: int):
    """The task dataset; for the crafted scenarios with a "kind" column ("live" or "flat")."""
    dataset = load_task_dataset(DEFAULT_TASK, n=n_prompts, seed=seed)
    if scenario == "task":
        return dataset
    kinds = [_kind(scenario, i, prompts_per_rank) for i in range(n_prompts)]
    return dataset.add_column("kind", kinds)


def build_rewards(scenario: str, scored: Counter):
    """Reward functions for `scenario`; every call counts the kinds this rank scored into `scored`."""
    if scenario == "task":
        task_rewards = get_reward_funcs(DEFAULT_TASK)

        def task_reward(prompts, completions, **kwargs):
            scored["task"] += len(completions)
            return task_rewards[0](prompts, completions, **kwargs)

        return [task_reward, *task_rewards[1:]]

    def crafted_reward(prompts, completions, kind, **kwargs):
        """Live rows: visible length of the completion / 100 (varies within a group); flat rows: constant."""
        scored.update(kind)
        return [
            len("".join(text.split())) / 100 if row_kind == "live" else FLAT_REWARD
            for text, row_kind in zip(completions, kind, strict=True)
        ]

    return [crafted_reward]
