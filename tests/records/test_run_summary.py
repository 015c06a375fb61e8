"""The end-of-run summary's pieces (grpo_hub.records.run_summary)."""

import pytest

from grpo_hub.records.run_summary import accuracy_line, reward_trend, summary_lines


def test_reward_trend_windows():
    assert reward_trend([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]) == pytest.approx((0.2, 0.8))
    assert reward_trend([0.0, 1.0]) == (0.0, 1.0)
    assert reward_trend([0.5]) == (0.5, 0.5)
    with pytest.raises(ValueError, match="logging_steps"):
        reward_trend([])


def test_accuracy_line_and_summary_lines_name_every_level_and_the_push():
    before, after = {"greedy": {1: 0.3, "all": 0.41}}, {"greedy": {1: 0.5, "all": 0.56}}
    assert accuracy_line(before, after) == "greedy: 1 0.30->0.50, all 0.41->0.56"
    summary = {
        "steps": 3, "world_size": 2, "train_seconds": 1.5, "wall_seconds": 2.0, "reward_first": 0.1,
        "reward_last": 0.2, "saved_to": "/out",
    }  # fmt: skip
    (done,) = summary_lines(summary)
    assert done.startswith("GRPO done: 3 steps on 2 process(es) in 1.5 s (2.0 s with engine set-up)")
    pushed = {"repo_id": "me/x", "revision": "main", "commit_sha": "abcdef123"}
    lines = summary_lines(
        {**summary, "heldout_before": before, "heldout_after": after, "pushed": pushed}, "digits"
    )
    assert (
        lines[1]
        == "held-out accuracy before -> after (per level = digits): greedy: 1 0.30->0.50, all 0.41->0.56"
    )
    assert lines[2].startswith("pushed to the Hub: me/x@main (commit abcdef1)")
    sampled = summary_lines(
        {**summary, "heldout_before": before, "heldout_after": after, "heldout_per_level": 20}, "digits"
    )
    assert sampled[1].startswith(
        "held-out accuracy before -> after (per level = digits, 20 problems each): greedy"
    )
