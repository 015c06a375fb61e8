"""Selective rollout (GRESO): skip prompts predicted to be zero-signal before generating them. Pure torch.

GRESO, Zheng et al. 2025, "Act Only When It Pays: Efficient Reinforcement Learning for LLM Reasoning via
Selective Rollouts", arXiv:2506.02177, §4 (probabilistic pre-rollout filtering with a self-adjusting
exploration probability); reference implementation on verl: Infini-AI-Lab/GRESO,
`verl/trainer/ttis/presampling_selector.py` (`easy_/hard_probabilistic_skip`) and
`verl/trainer/ppo/ray_trainer.py` (adaptation of `p_easy` / `p_hard`).

The rule, per prompt i and per zero-signal kind k in {all-max ("easy": every completion got the top reward),
all-min ("hard": every completion got the bottom reward)}:
  z_i     = length of the run of most recent scorings of i that were all of the same kind k (0 if the last
            scoring had signal, or i was never scored)
  P_skip  = 1 - max(p_k ** z_i, min_keep)          (GRESO: 1 - p_e^{z_i}, with the keep floor 0.01 of its code)
  p_k     <- clamp(p_k - step, lo, hi)   if the fraction of scored groups of kind k >= target_k
             clamp(p_k + step, lo, hi)   otherwise
  with target_max = target / 3, target_min = 2 * target / 3 (GRESO: a total zero-variance target, one third
  for easy and two thirds for hard prompts), step 0.01 and [lo, hi] = [0.05, 0.95] (GRESO's defaults).
The keep floor `min_keep` > 0 means every skipped prompt is revisited with probability >= min_keep each time it
comes up, so a prompt whose difficulty changed is eventually seen again.

Bounded revisit (grpo_hub; GRESO's code bounds the wait the same way in its alternative linear-backoff rule,
`hard_linear_backoff_skip`: skipped while fewer than a random draw from [0, k·z) epochs have passed since the
last scoring): a prompt skipped s_i times since its last scoring is generated when s_i >= k * z_i, whatever
P_skip. Without the bound, a prompt whose exploration probability sits at the 0.05 floor waits 20 (z = 1) to
100 (z >= 2) epochs on average, because z does not change while it is skipped; a hard prompt that one unlucky
all-wrong group labelled (success rate q gives an all-wrong group of n with probability (1 - q)^n: 0.43 for
q = 0.1, n = 8) then leaves training for good, while the model it could teach keeps improving.
"""

from __future__ import annotations

import torch

from grpo_hub.algos.advantages import ALL_MAX, ALL_MIN, INFORMATIVE, KIND_NAMES

EXPLORE_LOW, EXPLORE_HIGH = 0.05, 0.95  # GRESO's min_p / max_p
TARGET_SHARE = {
    ALL_MAX: 1 / 3,
    ALL_MIN: 2 / 3,
}  # GRESO: targeted_easy = target / 3, targeted_hard = 2 target / 3


def skip_probabilities(
    kinds: torch.Tensor,
    streaks: torch.Tensor,
    explore: dict[int, float],
    min_keep: float,
    skips: torch.Tensor | None = None,
    revisit_after: int | None = None,
) -> torch.Tensor:
    """(G,) float64: P_skip = 1 - max(p_k ** z, min_keep) for groups whose history is zero-signal of kind k,
    and 0 where the bounded revisit applies (`skips` >= `revisit_after` * z).

    `kinds` (G,) are the kinds of the last scorings, `streaks` (G,) the run lengths z (0: no skip),
    `explore` {ALL_MAX: p_max, ALL_MIN: p_min}, `skips` (G,) the skips since the last scoring (needed with
    `revisit_after`; None: no bound).
    """
    probs = torch.zeros(kinds.shape, dtype=torch.float64)
    for kind, p in explore.items():
        pick = (kinds == kind) & (streaks > 0)
        keep = torch.clamp(p ** streaks[pick].double(), min=min_keep)
        probs[pick] = 1.0 - keep
    if revisit_after is not None:
        probs[skips >= revisit_after * streaks] = 0.0
    return probs


def adapt_exploration(explore: float, kind_frac: float, target: float, step: float) -> float:
    """GRESO's update of one kind's exploration probability p toward a target zero-signal fraction.

    p - step when the fraction of scored groups of that kind is >= its target (skip more), p + step otherwise,
    clamped to [EXPLORE_LOW, EXPLORE_HIGH].
    """
    moved = explore - step if kind_frac >= target else explore + step
    return min(max(moved, EXPLORE_LOW), EXPLORE_HIGH)


class OutcomeHistory:
    """Per prompt id (int64): kind of the last scoring, length of its same-kind run, skips since scored.

    `record(ids, kinds)` updates from one scoring and returns (revisits, informative revisits): of the scored
    prompts, those skipped at least once since their previous scoring, and how many of them had signal (the
    filter's error). `lookup(ids)` returns (kinds, streaks, skips) for `skip_probabilities`.
    """

    def __init__(self):
        self._kind: dict[int, int] = {}
        self._streak: dict[int, int] = {}
        self._skips: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._kind)

    def lookup(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kinds = torch.tensor([self._kind.get(i, INFORMATIVE) for i in ids], dtype=torch.long)
        streaks = torch.tensor([self._streak.get(i, 0) for i in ids], dtype=torch.long)
        skips = torch.tensor([self._skips.get(i, 0) for i in ids], dtype=torch.long)
        return kinds, streaks, skips

    def mark_skipped(self, ids: list[int]) -> None:
        for prompt in ids:
            self._skips[prompt] = self._skips.get(prompt, 0) + 1

    def record(self, ids: list[int], kinds: list[int]) -> tuple[int, int]:
        revisits = informative = 0
        for prompt, kind in zip(ids, kinds, strict=True):
            if self._skips.pop(prompt, 0):
                revisits += 1
                informative += kind == INFORMATIVE
            same = kind != INFORMATIVE and self._kind.get(prompt) == kind
            self._streak[prompt] = self._streak.get(prompt, 0) + 1 if same else int(kind != INFORMATIVE)
            self._kind[prompt] = kind
        return revisits, informative

    def state_dict(self) -> dict[str, torch.Tensor]:
        ids = list(self._kind)
        return {
            "ids": torch.tensor(ids, dtype=torch.long),
            "kinds": torch.tensor([self._kind[i] for i in ids], dtype=torch.long),
            "streaks": torch.tensor([self._streak[i] for i in ids], dtype=torch.long),
            "skipped": torch.tensor(list(self._skips), dtype=torch.long),
            "skip_counts": torch.tensor(list(self._skips.values()), dtype=torch.long),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        ids = state["ids"].tolist()
        self._kind = dict(zip(ids, state["kinds"].tolist(), strict=True))
        self._streak = dict(zip(ids, state["streaks"].tolist(), strict=True))
        # a checkpoint from before the skip counts: one skip each
        counts = state.get("skip_counts", torch.ones_like(state["skipped"]))
        self._skips = dict(zip(state["skipped"].tolist(), counts.tolist(), strict=True))


def kind_fractions(kinds: torch.Tensor) -> dict[int, float]:
    """{ALL_MAX: fraction of groups all-max, ALL_MIN: fraction all-min} of one scoring (0 for no groups)."""
    total = max(kinds.numel(), 1)
    return {kind: float((kinds == kind).sum()) / total for kind in KIND_NAMES}
