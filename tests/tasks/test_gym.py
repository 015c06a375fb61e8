"""GRPO on gymnasium: rollouts, advantages on trajectories, errors, and a short CartPole training run."""

import importlib.util
import json
import math
import statistics

import numpy as np
import pytest
import torch

from tests.conftest import REPO_ROOT, requires

pytestmark = pytest.mark.gym
RECIPE = REPO_ROOT / "recipes" / "cartpole.py"


@pytest.fixture
def gg():
    """grpo_hub.tasks.gym, imported only once gymnasium is known to be there."""
    requires("gymnasium", "tests/tasks/test_gym.py drives gymnasium environments")
    import grpo_hub.tasks.gym

    return grpo_hub.tasks.gym


def cartpole_batch(gg, seeds, group_size, seed=0):
    torch.manual_seed(seed)
    envs = gg.make_envs("CartPole-v1", len(seeds) * group_size)
    policy = gg.make_policy(4, 2, 16)
    return gg.rollout(policy, envs, seeds, group_size, torch.Generator().manual_seed(seed))


def naive_advantages(episodes, group_size, variant, gamma, eps=1e-4):
    """Per-episode reward lists (unpadded, group-major) -> per-episode advantage lists, in plain Python."""

    def rtg(rewards):
        out, running = [], 0.0
        for r in reversed(rewards):
            running = r + gamma * running
            out.append(running)
        return out[::-1]

    def normalise(values):
        mean, std = statistics.fmean(values), statistics.stdev(values)
        return [(v - mean) / (std + eps) for v in values]

    result = []
    for g in range(0, len(episodes), group_size):
        group = episodes[g : g + group_size]
        if variant == "outcome":
            adv = normalise([sum(r * gamma**t for t, r in enumerate(ep)) for ep in group])
            result += [[a] * len(ep) for a, ep in zip(adv, group, strict=True)]
            continue
        values = [rtg(ep) for ep in group] if variant == "process_rtg" else group
        flat = normalise([v for ep in values for v in ep])
        split = []
        for ep in values:
            split.append(flat[: len(ep)])
            flat = flat[len(ep) :]
        result += split if variant == "process_rtg" else [rtg(ep) for ep in split]
    return result


def test_same_seed_group_members_reset_identically_and_groups_differ(gg):
    seeds = [11, 12, 13]
    batch = cartpole_batch(gg, seeds, group_size=4)
    first = batch.first_obs.reshape(3, 4, -1)
    assert np.array_equal(first, np.broadcast_to(first[:, :1], first.shape))  # identical within a group
    assert not np.allclose(first[0, 0], first[1, 0]) and not np.allclose(first[1, 0], first[2, 0])
    import gymnasium

    fresh = gymnasium.make("CartPole-v1")
    for g, seed in enumerate(seeds):  # group-major: rows g*G..(g+1)*G-1 reset with seeds[g]
        assert np.array_equal(first[g, 0], fresh.reset(seed=seed)[0])
        assert torch.equal(batch.obs[g * 4, 0], torch.as_tensor(first[g, 0]))
    # members of a group then sample different actions: episodes diverge
    assert len({tuple(batch.actions[i][batch.mask[i]].tolist()) for i in range(4)}) > 1


def test_rollout_pads_after_termination_and_is_reproducible(gg):
    batch = cartpole_batch(gg, [5, 6], group_size=4)
    lengths = batch.mask.sum(1)
    assert batch.mask.shape[1] == lengths.max() and lengths.min() < lengths.max()
    steps = torch.arange(batch.mask.shape[1])
    assert torch.equal(batch.mask, steps[None] < lengths[:, None])  # valid steps form a prefix
    assert torch.equal(batch.rewards, batch.mask.float())  # CartPole: +1 per step taken, 0 padding
    assert batch.obs[~batch.mask].abs().sum() == 0 and batch.logp[~batch.mask].abs().sum() == 0
    assert (batch.logp[batch.mask] < 0).all()
    again = cartpole_batch(gg, [5, 6], group_size=4)
    assert torch.equal(batch.actions, again.actions) and torch.equal(batch.obs, again.obs)


@pytest.mark.parametrize("variant", ["outcome", "process", "process_rtg"])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_advantages_of_real_rollouts_match_per_episode_computation(gg, variant, gamma):
    from grpo_hub.algos.advantages import process_advantages

    batch = cartpole_batch(gg, [1, 2], group_size=4)
    # non-constant step rewards so that "process" is not trivially zero: reward t+1 at step t
    rewards = torch.where(batch.mask, torch.arange(batch.mask.shape[1], dtype=torch.float32) + 1.0, 0.0)
    adv = process_advantages(rewards, batch.mask.float(), 4, variant=variant, gamma=gamma)
    episodes = [rewards[i][batch.mask[i]].tolist() for i in range(8)]
    expected = naive_advantages(episodes, 4, variant, gamma)
    for i in range(8):
        torch.testing.assert_close(adv[i][batch.mask[i]], torch.tensor(expected[i]), rtol=1e-4, atol=1e-4)
    assert adv[~batch.mask].abs().sum() == 0


def test_hand_built_trajectories_three_variants():
    """Two groups of two CartPole-like episodes (+1 per step), lengths 3, 1 | 2, 2, padded to T = 3."""
    from grpo_hub.algos.advantages import process_advantages

    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.float32)
    rewards = mask.clone()
    outcome = process_advantages(rewards, mask, 2, variant="outcome")
    a = 1 / (math.sqrt(2) + 1e-4)  # returns 3 vs 1: (3 - 2) / stdev(3, 1)
    torch.testing.assert_close(outcome, torch.tensor([[a, a, a], [-a, 0, 0], [0, 0, 0], [0, 0, 0]]))
    assert process_advantages(rewards, mask, 2, variant="process").abs().max() == 0  # degenerate
    rtg = process_advantages(rewards, mask, 2, variant="process_rtg")
    assert rtg[0, 0] > 0 and rtg[1, 0] < rtg[0, 0] and rtg[0, 2] < 0  # long episodes' early steps win
    torch.testing.assert_close(rtg[2], rtg[3])  # equal episodes, equal advantages
    assert rtg[:, 0].tolist() != outcome[:, 0].tolist()


def test_bad_env_ids_and_action_spaces_raise_clear_errors(gg):
    with pytest.raises(ValueError, match="unknown gymnasium env id 'NoSuchEnv-v0'"):
        gg.make_envs("NoSuchEnv-v0", 2)
    for env_id in ("Pendulum-v1", "MountainCarContinuous-v0"):
        with pytest.raises(ValueError, match=f"{env_id}.*Box.*needs a Discrete action space"):
            gg.make_envs(env_id, 2)
    with pytest.raises(ValueError, match="variant='foo' is unknown"):
        gg.GymGRPOConfig(variant="foo")
    with pytest.raises(ValueError, match="group_size=1 must be >= 2"):
        gg.GymGRPOConfig(group_size=1)
    with pytest.raises(ValueError, match="kl_to='new' is unknown"):
        gg.GymGRPOConfig(kl_to="new")


def test_short_training_beats_random_on_cartpole(gg, tmp_path):
    cfg = gg.GymGRPOConfig(variant="process_rtg", max_env_steps=12_000, eval_episodes=20, seed=0)
    result = gg.train(cfg, log_dir=tmp_path, progress=False)
    untrained = gg.make_policy(4, 2, cfg.hidden)
    baseline = gg.evaluate(untrained, "CartPole-v1", 20, seed=1_000_000).mean()
    assert result["final_eval_return"] > 100 > baseline  # random play averages ~22
    history = result["history"]
    assert history[-1]["return_mean"] > 2 * history[0]["return_mean"]
    assert [r["env_steps"] for r in history] == sorted(r["env_steps"] for r in history)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["final_eval_return"] == result["final_eval_return"]
    assert (tmp_path / "progress.csv").read_text().count("\n") == len(history) + 1
    untrained.load_state_dict(torch.load(tmp_path / "policy.pt"))
    assert gg.evaluate(untrained, "CartPole-v1", 20, seed=1_000_000).mean() == result["final_eval_return"]


def test_process_variant_is_degenerate_on_cartpole_and_learns_nothing(gg):
    cfg = gg.GymGRPOConfig(variant="process", max_env_steps=2_000, eval_episodes=5, seed=3)
    torch.manual_seed(cfg.seed)
    initial = gg.make_policy(4, 2, cfg.hidden).state_dict()
    with pytest.warns(UserWarning, match="every advantage of iteration 0 is zero"):
        result = gg.train(cfg, progress=False)
    assert all(r["adv_abs_max"] == 0 for r in result["history"])
    for name, tensor in result["policy"].state_dict().items():
        assert torch.equal(tensor, initial[name]), name  # zero gradient: not a single weight moved


def test_kl_penalty_to_reference_keeps_the_policy_close_to_it(gg):
    def final_kl(beta):
        cfg = gg.GymGRPOConfig(beta=beta, kl_to="ref", max_env_steps=3_000, eval_episodes=2, seed=1)
        return gg.train(cfg, progress=False)["history"][-1]["kl"]  # k3 KL(policy || initial policy)

    weak, strong = final_kl(0.01), final_kl(5.0)
    assert weak > 0.01 and strong < weak / 10


def test_recipe_writes_results_table_for_a_sweep(gg, tmp_path):
    spec = importlib.util.spec_from_file_location("cartpole_recipe", RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    argv = ["--variant", "process", "outcome", "--seed", "0", "1", "--max-env-steps", "300"]
    with pytest.warns(UserWarning, match="'process': every advantage"):
        summaries = recipe.main([*argv, "--eval-episodes", "3", "--out", str(tmp_path), "--no-progress"])
    assert [(s["config"]["variant"], s["config"]["seed"]) for s in summaries] == [
        ("process", 0),
        ("process", 1),
        ("outcome", 0),
        ("outcome", 1),
    ]
    table = (tmp_path / "results.md").read_text()
    assert table.count("| process |") == 2 and table.count("| outcome |") == 2
    assert (tmp_path / "outcome-seed1" / "progress.csv").exists()


def test_plot_returns_draws_a_png_when_matplotlib_is_installed(gg, tmp_path):
    runs = {"a": [{"env_steps": 10, "return_mean": 20.0}, {"env_steps": 30, "return_mean": 60.0}]}
    drawn = gg.plot_returns(runs, tmp_path / "returns.png")
    assert drawn == (importlib.util.find_spec("matplotlib") is not None)
    assert (tmp_path / "returns.png").exists() == drawn
    if drawn:
        assert (tmp_path / "returns.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
