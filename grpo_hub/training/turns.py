"""Multi-turn credit assignment: turn ids from TRL's tool mask, per-turn rewards, MT-GRPO turn-level advantages.

Turns. In TRL 1.16's tool loop (`GRPOTrainer._tool_call_loop`) a completion is the model's first message,
then for each tool call the tool's output (tokens with `tool_mask` 0, no loss) and the model's next message
(`tool_mask` 1); a `rollout_func` may return the same mask as `env_mask`. A *turn* is a maximal run of
model tokens; `turn_ids_from_tool_mask` numbers them 1, 2, ... . One turn per assistant message of the
conversational completion TRL hands the reward functions.

Per-turn rewards. TRL wants one float per completion from a reward function. A function decorated with
`@per_turn_reward` returns instead, per completion, a list with one float per assistant message (None for a
turn it does not score); TRL receives the sum of the row's floats (so the logged reward, the group baseline
and zero-signal filtering see the total), and the lists are kept for `mt_grpo_advantages`.

Pure torch except `per_turn_reward`, which only wraps a Python callable.
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

from grpo_hub.algos import advantages as adv_fns


def turn_ids_from_tool_mask(tool_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) turn index of each token: a turn is a run of model tokens (tool_mask 1) between tool outputs.

    Starts are the 1s whose left neighbour is 0 (or the row start); ids are their running count, so the k-th
    model run has id k and a tool output keeps the id of the turn before it (it is masked out of the loss).
    """
    starts = tool_mask.bool() & ~torch.nn.functional.pad(tool_mask.bool(), (1, 0))[:, :-1]
    return starts.long().cumsum(dim=1)


def per_turn_reward(func):
    """Mark a TRL reward function as returning, per completion, a list of per-turn rewards (see module doc).

    The wrapper returns the sum of each list to TRL (None when the list is None or holds only None) and
    stores the lists of its latest call in `wrapper.turn_rewards`. Sync and async functions are supported.
    """

    def totals(lists):
        wrapper.turn_rewards = lists
        sums = []
        for row in lists:
            scored = [r for r in (row or []) if r is not None]
            sums.append(math.fsum(scored) if scored else None)
        return sums

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def wrapper(*args, **kwargs):
            return totals(await func(*args, **kwargs))

    else:

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            return totals(func(*args, **kwargs))

    wrapper.turn_rewards = None
    wrapper.is_per_turn_reward = True
    return wrapper


def turn_reward_matrix(lists: list, num_turns: torch.Tensor, name: str = "reward") -> torch.Tensor:
    """(B, K) float matrix of per-turn rewards, NaN where unscored; K = max(num_turns, 1).

    `lists[i]` has one entry per turn of row i (`num_turns[i]`); rows with no turn left (fully masked,
    e.g. truncated with mask_truncated_completions) may hold anything and get NaN. A length mismatch raises.
    """
    width = max(int(num_turns.max()) if num_turns.numel() else 0, 1)
    out = torch.full((len(lists), width), math.nan)
    for i, (row, turns) in enumerate(zip(lists, num_turns.tolist(), strict=True)):
        if turns == 0 or row is None:
            continue
        if len(row) != turns:
            raise ValueError(
                f"per-turn reward function {name!r} returned {len(row)} rewards for completion {i}, which has "
                f"{turns} assistant turns. Fix: return one value (or None) per assistant message."
            )
        out[i, :turns] = torch.tensor([math.nan if r is None else float(r) for r in row])
    return out


def mt_grpo_advantages(
    turn_rewards: torch.Tensor,
    outcome_rewards: torch.Tensor | None,
    group_size: int,
    *,
    scope: str = "turn",
    norm: str = "mean_std",
) -> torch.Tensor:
    """(B, K) advantages of each turn: MT-GRPO's turn-level estimate generalised to K turns.

    A_i,k = Â^turn_i,k + Â^outcome_i, with Â^turn = `advantages.turn_group_advantages(turn_rewards, scope=scope)`
    (0 where a turn is unscored, NaN) and Â^outcome = `advantages.group_advantages(outcome_rewards)` (0 if
    None). MT-GRPO (Zeng et al. 2025, arXiv:2505.11821, §3.2) uses Â_1 = Â^T + λ·Â^O for the tool-calling turn
    and Â_2 = Â^O for the final turn; here λ = 1 and a turn without a turn reward is the final-turn case.
    """
    valid = ~torch.isnan(turn_rewards)
    advantages = adv_fns.turn_group_advantages(turn_rewards, valid, group_size, scope=scope, norm=norm)
    if outcome_rewards is not None:
        advantages = advantages + adv_fns.group_advantages(outcome_rewards, group_size, norm=norm)[:, None]
    return advantages


def token_advantages(turn_advantages: torch.Tensor, turn_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) advantage of each token: that of its turn (`turn_ids` 1-based; id 0 gets 0)."""
    padded = torch.nn.functional.pad(turn_advantages, (1, 0))  # column 0: before the first turn
    return padded.gather(1, turn_ids.clamp(max=turn_advantages.shape[1]))


class TurnCredit:
    """Trainer glue for `turn_advantages`: per-token advantages of this rank's rows from per-turn rewards.

    The @per_turn_reward functions ran on this rank's rows; their matrices are padded to the widest row on
    any rank and gathered, so groups that span ranks are normalised whole (as TRL does for rewards).
    `gather` is the trainer's all-rank gather (to its device); `weights` the reward weights.
    """

    def __init__(
        self, reward_funcs: list, reward_names: list[str], weights: torch.Tensor, scope: str, gather
    ):
        self.indices = [i for i, f in enumerate(reward_funcs) if getattr(f, "is_per_turn_reward", False)]
        if not self.indices:
            raise ValueError(
                "`turn_advantages`: no reward function returns per-turn rewards. Fix: decorate one with "
                "grpo_hub.training.turns.per_turn_reward, or set turn_advantages=None."
            )
        self.reward_funcs, self.reward_names = reward_funcs, reward_names
        self.weights, self.scope, self.gather = weights, scope, gather

    def _gathered_turn_rewards(self, num_turns: torch.Tensor) -> torch.Tensor:
        weights = self.weights.tolist()
        matrices = [
            weights[i]
            * turn_reward_matrix(self.reward_funcs[i].turn_rewards, num_turns.cpu(), self.reward_names[i])
            for i in self.indices
        ]
        stacked = torch.stack(matrices)
        local = stacked.nansum(dim=0).masked_fill(torch.isnan(stacked).all(dim=0), math.nan)
        width = int(self.gather(torch.tensor([local.shape[1]])).max())
        local = torch.nn.functional.pad(local, (0, width - local.shape[1]), value=math.nan)
        return self.gather(local)

    def _outcome(self, rewards_per_func: torch.Tensor) -> torch.Tensor | None:
        others = [i for i in range(rewards_per_func.shape[1]) if i not in self.indices]
        if not others:
            return None
        columns = rewards_per_func[:, others]
        weights = self.weights.to(columns.device)[others]
        outcome = (columns * weights).nansum(dim=1)
        return outcome.masked_fill(torch.isnan(columns).all(dim=1), math.nan)

    def assign(
        self, output: dict, rewards_per_func, group_size: int, rank_rows: slice, norm: str, metrics
    ) -> torch.Tensor:
        """(rows, T) advantages for `output` (this rank's rows); 0 off the loss mask. Logs turns per completion."""
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        ids = turn_ids_from_tool_mask(loss_mask)
        num_turns = ids.max(dim=1).values
        turn_rewards = self._gathered_turn_rewards(num_turns)
        outcome = self._outcome(rewards_per_func)
        per_turn = mt_grpo_advantages(turn_rewards, outcome, group_size, scope=self.scope, norm=norm)
        metrics["turns/mean_per_completion"].append(self.gather(num_turns.float()).mean().item())
        tokens = token_advantages(per_turn[rank_rows].to(ids.device), ids)
        return tokens * loss_mask
