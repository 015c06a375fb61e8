"""GRPO for discrete-action gymnasium environments (CartPole-v1, Acrobot-v1, ...), in one file.

A critic-free policy-gradient loop in the GRPO shape (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300):

1. rollout: `n_groups` groups of `group_size` episodes; every member of a group resets with the SAME
   seed, so a group is "one prompt, G sampled answers" and the group baseline compares like with like;
2. advantages: `grpo_hub.algos.advantages.process_advantages` on the padded per-step rewards, in one of its
   variants -- "outcome" (group-normalised episode return on every step), "process" (DeepSeekMath
   process supervision: per-step rewards normalised over the group, then return-to-go) or
   "process_rtg" (return-to-go first, then normalised over the group's valid steps);
3. update: a few epochs of shuffled minibatches over the valid steps with the clipped surrogate
   (PPO, Schulman et al. 2017, arXiv:1707.06347) from `grpo_hub.algos.losses`, plus an optional k3 KL
   penalty (Schulman 2020, "Approximating KL divergence") to the rollout policy or to the initial one.

With CartPole's constant +1 reward the "process" variant is degenerate: every valid step has the same
reward, so the group-normalised step rewards -- and hence all advantages -- are zero and nothing is
learned. `train` logs `adv_abs_mean` for every iteration and warns when the advantages vanish.

Environments are stepped as a batch: one policy forward for all live episodes per time step, and an
episode that has ended is no longer stepped (its row is padded and masked).
"""

from __future__ import annotations

import copy
import csv
import json
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from grpo_hub.algos.advantages import PROCESS_VARIANTS, process_advantages
from grpo_hub.algos.losses import clipped_surrogate, kl_penalty

try:
    import gymnasium
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("grpo_hub.tasks.gym needs gymnasium: pip install 'grpo-hub[gym]'") from err

VARIANTS = PROCESS_VARIANTS  # owned by the advantage function that reads it


@dataclass
class GymGRPOConfig:
    """Hyper-parameters of `train`; the defaults solve CartPole-v1 with the process_rtg variant."""

    env_id: str = "CartPole-v1"
    variant: str = "process_rtg"  # one of VARIANTS
    gamma: float = 0.99  # discount of the (return-to-go) returns inside process_advantages
    group_size: int = 8  # episodes per group, all reset with one seed
    n_groups: int = 4  # groups per iteration
    hidden: int = 64  # width of the two tanh layers of the policy MLP
    lr: float = 3e-3
    epochs: int = 4  # passes over each rollout
    minibatch_size: int = 512  # valid steps per gradient step
    eps_low: float = 0.2  # clip range: ratio in [1 - eps_low, 1 + eps_high]
    eps_high: float = 0.2
    beta: float = 0.0  # weight of the k3 KL penalty (0 = off)
    kl_to: str = "old"  # "old": rollout policy of this iteration; "ref": frozen initial policy
    max_grad_norm: float = 1.0
    max_env_steps: int = 200_000  # training budget (valid steps of training episodes)
    target_return: float = 475.0  # "solved": mean greedy eval return over eval_episodes reaches this
    eval_episodes: int = 100
    eval_threshold: float = 200.0  # run the eval only after an iteration whose mean return is >= this
    seed: int = 0

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"variant={self.variant!r} is unknown; use one of {VARIANTS}")
        if self.kl_to not in ("old", "ref"):
            raise ValueError(
                f"kl_to={self.kl_to!r} is unknown; use 'old' (rollout policy) or 'ref' (initial)"
            )
        for name in (
            "group_size",
            "n_groups",
            "hidden",
            "epochs",
            "minibatch_size",
            "max_env_steps",
            "eval_episodes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.group_size < 2:
            raise ValueError(
                f"group_size={self.group_size} must be >= 2: a group baseline needs two episodes"
            )
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma={self.gamma} must be in (0, 1]")
        for name in ("lr", "eps_low", "eps_high", "max_grad_norm"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        if self.beta < 0:
            raise ValueError(f"beta={self.beta} must be >= 0 (0 switches the KL penalty off)")


def make_envs(env_id: str, n: int) -> list:
    """`n` copies of a gymnasium env with a Discrete action space and a flat Box observation.

    Raises ValueError naming the problem for an unknown id, a continuous (or other non-Discrete)
    action space, a non-flat observation, or an env without a time limit (episodes must end).
    """
    try:
        envs = [gymnasium.make(env_id) for _ in range(n)]
    except gymnasium.error.Error as err:
        raise ValueError(
            f"unknown gymnasium env id {env_id!r} ({err}); use a registered discrete-action env such as "
            "'CartPole-v1', 'Acrobot-v1' or 'MountainCar-v0'"
        ) from err
    env = envs[0]
    if not isinstance(env.action_space, gymnasium.spaces.Discrete):
        raise ValueError(
            f"{env_id!r} has action space {env.action_space}; grpo_hub.tasks.gym samples from a categorical policy "
            "and needs a Discrete action space (e.g. 'CartPole-v1', 'Acrobot-v1', 'MountainCar-v0')"
        )
    obs_space = env.observation_space
    if not isinstance(obs_space, gymnasium.spaces.Box) or len(obs_space.shape) != 1:
        raise ValueError(f"{env_id!r} has observation space {obs_space}; the MLP policy needs a flat Box")
    if env.spec is None or env.spec.max_episode_steps is None:
        raise ValueError(f"{env_id!r} has no max_episode_steps; register it with a time limit")
    return envs


def make_policy(obs_dim: int, n_actions: int, hidden: int) -> nn.Module:
    """Two-layer tanh MLP producing action logits; the last layer starts near zero (uniform policy),
    as recommended by Andrychowicz et al. 2021 ("What matters in on-policy RL", arXiv:2006.05990)."""
    policy = nn.Sequential(
        nn.Linear(obs_dim, hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, n_actions),
    )
    with torch.no_grad():
        policy[-1].weight.mul_(0.01)
        policy[-1].bias.zero_()
    return policy


@dataclass
class Rollout:
    """A batch of episodes padded to the longest one; rows are group-major (rows g*G..(g+1)*G-1 = group g)."""

    obs: torch.Tensor  # (B, T, obs_dim), 0 after the episode ended
    actions: torch.Tensor  # (B, T) long
    logp: torch.Tensor  # (B, T) log-prob of the action under the rollout policy
    rewards: torch.Tensor  # (B, T) float32, 0 after the episode ended
    mask: torch.Tensor  # (B, T) bool, True on the steps the episode took
    first_obs: np.ndarray  # (B, obs_dim) observation returned by reset

    @property
    def returns(self) -> torch.Tensor:
        """Undiscounted episode returns, (B,)."""
        return self.rewards.sum(1)


@torch.no_grad()
def rollout(
    policy: nn.Module, envs: list, seeds, group_size: int, generator: torch.Generator, greedy: bool = False
) -> Rollout:
    """Run one episode in each env, env i resetting with seeds[i // group_size]; live envs step as a batch.

    Actions are sampled from the categorical policy with `generator` (or argmax when `greedy`).
    """
    if len(envs) != len(seeds) * group_size:
        raise ValueError(f"{len(envs)} envs cannot hold {len(seeds)} groups of {group_size}")
    b, horizon = len(envs), envs[0].spec.max_episode_steps
    first = np.stack([env.reset(seed=int(seeds[i // group_size]))[0] for i, env in enumerate(envs)])
    obs = torch.zeros(b, horizon, first.shape[1])
    actions = torch.zeros(b, horizon, dtype=torch.long)
    logp = torch.zeros(b, horizon)
    rewards = torch.zeros(b, horizon)
    mask = torch.zeros(b, horizon, dtype=torch.bool)
    current, live, t = torch.tensor(first, dtype=torch.float32), np.arange(b), 0  # a copy: first stays
    while len(live) and t < horizon:
        logits = policy(current[live])
        probs = torch.softmax(logits, -1)
        a = probs.argmax(-1) if greedy else torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        obs[live, t], actions[live, t], mask[live, t] = current[live], a, True
        logp[live, t] = torch.log_softmax(logits, -1).gather(-1, a[:, None]).squeeze(-1)
        still = []
        for i, action in zip(live, a.tolist(), strict=True):
            o, r, terminated, truncated, _ = envs[i].step(action)
            current[i], rewards[i, t] = torch.as_tensor(o, dtype=torch.float32), float(r)
            if not (terminated or truncated):
                still.append(i)
        live, t = np.array(still, dtype=int), t + 1
    return Rollout(obs[:, :t], actions[:, :t], logp[:, :t], rewards[:, :t], mask[:, :t], first)


def action_logp(policy: nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log pi(a|s) for a flat batch of observations (N, obs_dim) and actions (N,)."""
    return torch.log_softmax(policy(obs), -1).gather(-1, actions[:, None]).squeeze(-1)


def grpo_update(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Rollout,
    advantages: torch.Tensor,
    cfg: GymGRPOConfig,
    generator: torch.Generator,
    ref_policy: nn.Module | None = None,
) -> dict:
    """Clipped-surrogate epochs over shuffled minibatches of the valid steps (loss = mean over steps).

    KL (k3) is taken to the rollout policy (`cfg.kl_to="old"`) or to `ref_policy` ("ref").
    Returns the mean loss, KL and clip fraction of the last epoch.
    """
    m = batch.mask
    obs, actions, old_logp, adv = batch.obs[m], batch.actions[m], batch.logp[m], advantages[m]
    ref_logp = old_logp
    if cfg.beta > 0 and cfg.kl_to == "ref":
        with torch.no_grad():
            ref_logp = action_logp(ref_policy, obs, actions)
    n = len(actions)
    for _ in range(cfg.epochs):
        sums = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0}
        for idx in torch.randperm(n, generator=generator).split(cfg.minibatch_size):
            logp = action_logp(policy, obs[idx], actions[idx])
            ratio = torch.exp(logp - old_logp[idx])
            per_step = clipped_surrogate(ratio, adv[idx], cfg.eps_low, cfg.eps_high)
            kl = kl_penalty(logp, ref_logp[idx], kind="k3")
            loss = (per_step + cfg.beta * kl).mean() if cfg.beta > 0 else per_step.mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
            clipped = (ratio < 1 - cfg.eps_low) | (ratio > 1 + cfg.eps_high)
            for key, value in (("loss", loss), ("kl", kl.mean()), ("clip_frac", clipped.float().mean())):
                sums[key] += value.item() * len(idx) / n
    return sums


def evaluate(policy: nn.Module, env_id: str, episodes: int, seed: int, greedy: bool = True) -> np.ndarray:
    """Returns of `episodes` episodes, episode i reset with seed + i (argmax actions unless greedy=False)."""
    envs = make_envs(env_id, episodes)
    generator = torch.Generator().manual_seed(seed)
    return rollout(policy, envs, np.arange(episodes) + seed, 1, generator, greedy=greedy).returns.numpy()


def train(cfg: GymGRPOConfig, log_dir: str | Path | None = None, progress: bool = True) -> dict:
    """GRPO on `cfg.env_id` until the greedy eval mean reaches `cfg.target_return` or the step budget ends.

    Writes `progress.csv` (one row per iteration), `summary.json` and `policy.pt` (state dict) into
    `log_dir` when given.
    Env steps count the training episodes' steps only; evaluation episodes are not counted.
    Returns the summary dict (plus "history": the rows and "policy": the trained module).
    """
    from tqdm.auto import tqdm

    torch.manual_seed(cfg.seed)
    rng, generator = np.random.default_rng(cfg.seed), torch.Generator().manual_seed(cfg.seed)
    envs = make_envs(cfg.env_id, cfg.n_groups * cfg.group_size)
    policy = make_policy(envs[0].observation_space.shape[0], int(envs[0].action_space.n), cfg.hidden)
    ref_policy = copy.deepcopy(policy).requires_grad_(False) if cfg.beta > 0 and cfg.kl_to == "ref" else None
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    eval_seed = 1_000_000 + cfg.seed  # eval episodes never share a reset seed with training groups
    history, env_steps, solved_at, best_eval, warned, start = [], 0, None, None, False, time.perf_counter()
    bar = tqdm(total=cfg.max_env_steps, disable=not progress, unit="step", desc=f"{cfg.env_id} {cfg.variant}")
    while env_steps < cfg.max_env_steps and solved_at is None:
        batch = rollout(policy, envs, rng.integers(0, 2**31 - 1, cfg.n_groups), cfg.group_size, generator)
        adv = process_advantages(
            batch.rewards, batch.mask.float(), cfg.group_size, variant=cfg.variant, gamma=cfg.gamma
        )
        stats = grpo_update(policy, optimizer, batch, adv, cfg, generator, ref_policy)
        steps = int(batch.mask.sum())
        env_steps += steps
        returns, adv_abs = batch.returns, adv[batch.mask].abs()
        row = {
            "iteration": len(history),
            "env_steps": env_steps,
            "wall_s": round(time.perf_counter() - start, 3),
            "return_mean": returns.mean().item(),
            "return_min": returns.min().item(),
            "return_max": returns.max().item(),
            "adv_abs_mean": adv_abs.mean().item(),
            "adv_abs_max": adv_abs.max().item(),
            **stats,
            "eval_return": float("nan"),
        }
        if row["adv_abs_max"] < 1e-6 and not warned:
            warned = True
            warnings.warn(
                f"variant {cfg.variant!r}: every advantage of iteration {row['iteration']} is zero, so the "
                "policy gradient is zero and nothing is learned (constant per-step rewards make 'process' "
                "degenerate; use 'process_rtg' or 'outcome')",
                stacklevel=2,
            )
        if row["return_mean"] >= cfg.eval_threshold:
            row["eval_return"] = float(evaluate(policy, cfg.env_id, cfg.eval_episodes, eval_seed).mean())
            best_eval = max(best_eval or -np.inf, row["eval_return"])
            if row["eval_return"] >= cfg.target_return:
                solved_at = env_steps
        row["wall_s"] = round(time.perf_counter() - start, 3)
        history.append(row)
        bar.update(steps)
        bar.set_postfix(
            ret=f"{row['return_mean']:.0f}", adv=f"{row['adv_abs_mean']:.2f}", ev=row["eval_return"]
        )
    bar.close()
    final_eval = float(evaluate(policy, cfg.env_id, cfg.eval_episodes, eval_seed).mean())
    sampled_eval = float(evaluate(policy, cfg.env_id, cfg.eval_episodes, eval_seed, greedy=False).mean())
    summary = {
        "config": asdict(cfg),
        "solved": solved_at is not None,
        "solved_env_steps": solved_at,
        "env_steps": env_steps,
        "wall_s": round(time.perf_counter() - start, 2),
        "final_eval_return": final_eval,
        "final_sampled_return": sampled_eval,  # same episodes, actions sampled instead of argmax
        "best_eval_return": best_eval,
        "iterations": len(history),
    }
    if log_dir is not None:
        write_logs(Path(log_dir), history, summary)
        torch.save(policy.state_dict(), Path(log_dir) / "policy.pt")
    return {**summary, "history": history, "policy": policy}


def write_logs(log_dir: Path, history: list[dict], summary: dict) -> None:
    """progress.csv (one row per iteration) and summary.json in `log_dir`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "progress.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(history[0]))
        writer.writeheader()
        writer.writerows(history)
    (log_dir / "summary.json").write_text(json.dumps(summary, indent=2))


def plot_returns(runs: dict[str, list[dict]], path: str | Path) -> bool:
    """Mean training return vs env steps, one line per run; returns False (no file) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, history in runs.items():
        ax.plot([r["env_steps"] for r in history], [r["return_mean"] for r in history], label=label)
    ax.set(xlabel="env steps", ylabel="mean training return", title="GRPO on gymnasium")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
