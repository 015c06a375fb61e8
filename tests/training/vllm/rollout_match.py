"""Comparing two vLLM runs step by step while their rollouts match (imported by the tests, not the workers: the
vLLM environment has no pytest)."""

import pytest

# The largest change of a log-prob between the padded and the padding-free forward (measured 1.7e-5 on the chain model's
# 64-row batch: fp32 on other shapes and positions, docs/padding-free.md), with room: an absolute tolerance of the IS
# metrics, which are differences of trainer and sampler log-probs.
LOGP_ROUNDING = 5e-5


def assert_same_step(
    mine: dict, baseline: dict, loss_abs: float, rel: float, metric_abs: float = 1e-7
) -> None:
    """One step's logs: the same loss and IS metrics within the tolerances."""
    assert mine["loss"] == pytest.approx(baseline["loss"], abs=loss_abs)
    for key in (k for k in baseline if k.startswith(("sampling/", "vllm_is/"))):
        assert mine[key] == pytest.approx(baseline[key], rel=rel, abs=metric_abs), (
            key,
            mine[key],
            baseline[key],
        )


def same_rollouts(mine: dict, baseline: dict) -> bool:
    return (mine["reward"], mine["completions/mean_length"]) == (
        baseline["reward"],
        baseline["completions/mean_length"],
    )


def matched_steps(ours: list[dict], theirs: list[dict], loss_abs: float, rel: float) -> int:
    """The leading steps whose rollouts match (reward and mean length), each checked by `assert_same_step`; the
    count."""
    matched = 0
    for mine, baseline in zip(ours, theirs, strict=True):
        if not same_rollouts(mine, baseline):
            break
        assert_same_step(mine, baseline, loss_abs, rel)
        matched += 1
    return matched
