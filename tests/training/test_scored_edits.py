"""The seams' edits of the scored batch checked against the pure functions (reward transforms, advantage options,
KL in the reward, the geometric vLLM IS ratio, turn-level ratio pooling). That grpo_hub equals plain TRL is
tests/training/test_equivalence.py."""

import pytest
import torch

from grpo_hub.algos import advantages as adv_fns
from grpo_hub.generation.is_diagnostics import geometric_is_ratio
from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import make_trainer, scored_batch, tiny_config


def _reward(values):
    def fixed_reward(prompts, completions, **kwargs):
        return values[: len(completions)]

    return fixed_reward


def test_reward_transforms_feed_the_advantages(tmp_path, tiny_model_dir):
    raw = [0.0, 5.0, -5.0, 1.0, 2.0, 2.5, 3.0, -1.0]
    trainer = make_trainer(
        GRPOHubTrainer, tiny_model_dir, tiny_config(tmp_path, reward_clip=2.0), reward_funcs=[_reward(raw)]
    )
    batch = scored_batch(trainer)
    clipped = torch.tensor(raw).clamp(-2.0, 2.0)
    assert torch.equal(batch["advantages"], adv_fns.group_advantages(clipped, 4))
    assert trainer._metrics["train"]["reward_raw"] == [pytest.approx(sum(raw) / 8)]


def test_running_reward_norm_updates_only_in_training(tmp_path, tiny_model_dir):
    trainer = make_trainer(
        GRPOHubTrainer,
        tiny_model_dir,
        tiny_config(tmp_path, reward_norm="running"),
        reward_funcs=[_reward([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])],
    )
    scored_batch(trainer)
    assert trainer._reward_transform.moments[0].count == 8
    trainer.model.eval()
    inputs = [trainer.train_dataset[i] for i in range(8)]
    trainer._calculate_rewards(inputs, [x["prompt"] for x in inputs], ["a"] * 8, [[1]] * 8)
    assert trainer._reward_transform.moments[0].count == 8


@pytest.mark.parametrize(
    "options",
    [
        {"adv_norm": "no_baseline"},
        {"whiten_advantages": True},
        {"adv_clip_range": 0.5},
        {"adv_norm": "mean_only"},
    ],
)
def test_advantage_options(tmp_path, tiny_model_dir, options):
    raw = [0.0, 5.0, -5.0, 1.0, 2.0, 2.5, 3.0, -1.0]
    trainer = make_trainer(
        GRPOHubTrainer, tiny_model_dir, tiny_config(tmp_path, **options), reward_funcs=[_reward(raw)]
    )
    advantages = scored_batch(trainer)["advantages"]
    rewards = torch.tensor(raw)
    expected = {
        "adv_norm": {
            "no_baseline": rewards,
            "mean_only": adv_fns.group_advantages(rewards, 4, norm="mean_only"),
        },
        "whiten_advantages": {True: adv_fns.whiten(adv_fns.group_advantages(rewards, 4))},
        "adv_clip_range": {0.5: adv_fns.group_advantages(rewards, 4).clamp(-0.5, 0.5)},
    }
    ((name, value),) = options.items()
    torch.testing.assert_close(advantages, expected[name][value])
    assert not torch.equal(advantages, adv_fns.group_advantages(rewards, 4))


def test_token_level_kl_enters_the_reward(tmp_path, tiny_model_dir):
    raw = [0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    coef = 0.5
    config = tiny_config(tmp_path, beta=0.1, token_level_kl_coef=coef)
    trainer = make_trainer(GRPOHubTrainer, tiny_model_dir, config, reward_funcs=[_reward(raw)])
    with torch.no_grad():  # perturb the policy so that it differs from the reference model
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = scored_batch(trainer)
    ids, mask = (torch.cat([batch[f"prompt_{k}"], batch[f"completion_{k}"]], dim=1) for k in ("ids", "mask"))
    with torch.no_grad():  # the policy's log-probs, scored by TRL directly
        policy_logps = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, batch["completion_ids"].size(1)
        )[0]
    kl = ((policy_logps - batch["ref_per_token_logps"]) * batch["completion_mask"]).sum(1)
    assert kl.abs().min() > 1e-3
    expected = adv_fns.group_advantages(torch.tensor(raw) - coef * kl, 4)
    torch.testing.assert_close(batch["advantages"], expected)
    # the second group has constant task reward: only the KL term gives it a signal
    assert batch["advantages"][4:].abs().max() > 0.1


def test_token_level_kl_without_reference_is_rejected(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="`token_level_kl_coef`"):
        make_trainer(GRPOHubTrainer, tiny_model_dir, tiny_config(tmp_path, token_level_kl_coef=0.1))


def test_turn_level_without_multi_turn_is_rejected(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="`importance_sampling_level`"):
        make_trainer(GRPOHubTrainer, tiny_model_dir, tiny_config(tmp_path, importance_sampling_level="turn"))


def test_geometric_vllm_is_ratio_with_fake_sampler_logprobs():
    trainer_logps = -torch.rand(4, 6)
    sampler_logps = trainer_logps - torch.tensor([[0.1], [-0.1], [1.0], [0.0]])
    # tokens vLLM could not score: ratio 1, and left out of the geometric mean's token count
    sampler_logps[0, 1] = sampler_logps[1, 5] = sampler_logps[3, 2] = float("nan")
    mask = torch.ones(4, 6, dtype=torch.long)
    mask[0, 3:] = 0
    output = {
        "completion_mask": mask,
        "old_per_token_logps": trainer_logps,
        "sampling_per_token_logps": sampler_logps,
    }
    weights = geometric_is_ratio(output, "sequence_truncate", 0.5, 1.5)  # what use_vllm=True would configure
    # geometric mean of token ratios = exp(mean log-ratio over the scored tokens only), independent of the
    # length and of unscored tokens; then truncated
    expected = torch.tensor([[0.1], [-0.1], [1.0], [0.0]]).exp().clamp(0.5, 1.5)
    torch.testing.assert_close(weights, expected)
    diluted = torch.tensor([[0.2 / 3], [-0.5 / 6]]).exp()  # NaN tokens counted in the mean's denominator
    assert not torch.allclose(weights[:2], diluted)
    product = torch.exp(torch.tensor([[0.2], [-0.5], [6.0], [0.0]])).clamp(0.5, 1.5)  # TRL's pooling
    assert not torch.allclose(weights, product)


def _rollout(prompts, trainer):
    """Stand-in multi-turn rollout function (never called: the test scores a hand-made batch)."""
    raise AssertionError("not expected to generate")


def _turn_level_grads(trainer, inputs):
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.zero_grad()
    trainer.compute_loss(trainer.model, inputs).backward()
    return torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters() if p.grad is not None])


def test_turn_level_ratio_pools_per_assistant_turn(tmp_path, tiny_model_dir):
    levels = {}
    for level in ("turn", "sequence", "token"):
        args = tiny_config(tmp_path, loss_type="grpo", epsilon=0.05, importance_sampling_level=level)
        levels[level] = make_trainer(GRPOHubTrainer, tiny_model_dir, args, rollout_func=_rollout)
    torch.manual_seed(0)
    batch = {
        "prompt_ids": torch.randint(3, 500, (4, 5)),
        "prompt_mask": torch.ones(4, 5, dtype=torch.long),
        "completion_ids": torch.randint(3, 500, (4, 8)),
        "completion_mask": torch.ones(4, 8, dtype=torch.long),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "num_items_in_batch": torch.tensor(32),
    }
    with torch.no_grad():
        logps, _, _ = levels["token"]._get_per_token_logps_and_entropies(
            levels["token"].model,
            torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            torch.ones(4, 13, dtype=torch.long),
            8,
        )
    batch["old_per_token_logps"] = logps + 0.2 * torch.randn_like(logps)  # off-policy: ratios != 1
    one_turn = {**batch, "tool_mask": torch.ones(4, 8, dtype=torch.long)}
    two_turns = {**batch, "tool_mask": torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1]] * 4)}
    turn_one = _turn_level_grads(levels["turn"], one_turn)
    torch.testing.assert_close(turn_one, _turn_level_grads(levels["sequence"], one_turn))
    turn_two = _turn_level_grads(levels["turn"], two_turns)
    assert not torch.allclose(turn_two, _turn_level_grads(levels["sequence"], two_turns), atol=1e-6)
    assert not torch.allclose(turn_two, _turn_level_grads(levels["token"], two_turns), atol=1e-6)
