"""A graded-difficulty synthetic task: prompts always solved (reward 1), never solved (reward 0), or mixed.

Shared by the in-process tests and by `selective_worker.py` (run under accelerate; it imports `tests....` too).
Prompt i is "mixed" when i % 4 == 0 (a completion-dependent reward in [0, 1)), else alternately "easy"
(every completion gets 1.0: an all-max group) and "hard" (every completion gets 0.0: an all-min group).
"""

from datasets import Dataset

KINDS = ("mixed", "easy", "hard", "easy")


def graded_dataset(n: int) -> Dataset:
    prompts = [f"{KINDS[i % 4].capitalize()} task: {i % 10}" for i in range(n)]
    return Dataset.from_dict({"prompt": prompts, "index": list(range(n))})


def graded_reward(prompts, completions, completion_ids, **kwargs):
    """1.0 on "Easy" prompts, 0.0 on "Hard" prompts, (sum of ids mod 7) / 7 on "Mixed" prompts."""
    return [
        1.0 if p.startswith("Easy") else 0.0 if p.startswith("Hard") else (sum(ids) % 7) / 7
        for p, ids in zip(prompts, completion_ids, strict=True)
    ]
