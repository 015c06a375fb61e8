"""A mostly-degenerate task: only every k-th prompt is graded, the others get a constant (zero-signal) reward.

Shared by the in-process tests and by `dynamic_worker.py` (run under accelerate; it imports `tests....` too).
"""

from datasets import Dataset

from grpo_hub.tasks import digit_fraction_reward


def degenerate_dataset(n: int, live_every: int = 4) -> Dataset:
    """Prompts where only every `live_every`-th one is graded ("Write only digits"); the rest get a constant reward."""
    prompts = [
        f"Write only digits: {i % 10}" if i % live_every == 0 else f"Stay quiet: {i % 10}" for i in range(n)
    ]
    return Dataset.from_dict({"prompt": prompts, "index": list(range(n))})


def mostly_flat_reward(prompts, completions, completion_ids, **kwargs):
    """0.0 on "Stay quiet" prompts (zero-signal groups); a completion-dependent value in [0, 1) otherwise."""
    return [
        0.0 if p.startswith("Stay") else (sum(ids) % 7) / 7
        for p, ids in zip(prompts, completion_ids, strict=True)
    ]


def mostly_flat_digit_reward(prompts, completions, log_metric=None, **kwargs):
    """Digit fraction on "Write only digits" prompts (learnable), 0.5 on the others; logs the graded mean."""
    graded = digit_fraction_reward(prompts, completions)
    live = [r for p, r in zip(prompts, graded, strict=True) if not p.startswith("Stay")]
    if log_metric is not None and live:
        log_metric("digits_reward", sum(live) / len(live))
    return [0.5 if p.startswith("Stay") else r for p, r in zip(prompts, graded, strict=True)]
