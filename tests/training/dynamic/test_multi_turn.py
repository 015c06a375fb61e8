"""Multi-turn tool task on the tiny model: turn ids from TRL's tool_mask, per-turn advantages, turn-pooled ratios.

Generation is scripted (tests/training/dynamic/scripted.py) but everything after it is TRL's tool loop and grpo_hub.
"""

import pytest
import torch

from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.algos import losses
from grpo_hub.tasks.tool_task import (
    add,
    answer_reward,
    load_tool_dataset,
    tool_tokenizer,
)
from grpo_hub.training.turns import mt_grpo_advantages, turn_ids_from_tool_mask
from tests.helpers import CPU

from .scripted import OUTCOMES, TURN_REWARDS, tool_trainer


def scored_batch(trainer):
    inputs = [trainer.train_dataset[i] for i in range(2) for _ in range(trainer.num_generations)]
    trainer.model.train()
    return trainer._generate_and_score_completions(inputs)


def expected_turn_advantages() -> torch.Tensor:
    turn_rewards = torch.tensor([r + [float("nan")] * (2 - len(r)) for r in TURN_REWARDS] * 2)
    return mt_grpo_advantages(turn_rewards, torch.tensor(OUTCOMES * 2), group_size=4, scope="turn")


def test_tool_rollouts_get_turn_ids_and_per_turn_advantages(tmp_path, tiny_model_dir):
    trainer = tool_trainer(tmp_path, tiny_model_dir)
    batch = scored_batch(trainer)
    loss_mask = batch["completion_mask"] * batch["tool_mask"]
    assert (batch["tool_mask"] == 0).any(), "TRL's tool loop marked no tool-output tokens"
    ids = turn_ids_from_tool_mask(loss_mask)
    assert ids.max(dim=1).values.tolist() == [2, 2, 2, 1] * 2  # the "direct" rows answer in one turn
    advantages = batch["advantages"]
    assert advantages.shape == loss_mask.shape
    expected = expected_turn_advantages()
    for row in range(8):
        for turn in range(1, int(ids[row].max()) + 1):
            tokens = advantages[row][(ids[row] == turn) & loss_mask[row].bool()]
            torch.testing.assert_close(tokens, torch.full_like(tokens, expected[row, turn - 1].item()))
    assert (advantages[loss_mask == 0] == 0).all(), "tool-output and pad tokens must carry no advantage"
    logged = trainer._metrics["train"]["turns/mean_per_completion"]
    assert logged == [1.75]


def test_without_turn_advantages_each_completion_has_one_advantage(tmp_path, tiny_model_dir):
    trainer = tool_trainer(tmp_path, tiny_model_dir, turn_advantages=None)
    batch = scored_batch(trainer)
    assert batch["advantages"].shape == (8,)
    per_turn = scored_batch(tool_trainer(tmp_path, tiny_model_dir))["advantages"]
    wrong_answer = per_turn[1][per_turn[1] != 0].unique()
    assert wrong_answer.numel() == 2, "per-turn credit gives the two turns of a row different advantages"


def test_the_loss_pools_ratios_per_turn_and_uses_per_token_advantages(tmp_path, tiny_model_dir, monkeypatch):
    trainer = tool_trainer(tmp_path, tiny_model_dir)
    batch = scored_batch(trainer)
    torch.manual_seed(0)
    noise = 0.1 * torch.randn_like(batch["completion_mask"], dtype=torch.float)
    with torch.no_grad():
        current, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
            batch["completion_ids"].size(1),
        )
    batch["old_per_token_logps"] = current + noise  # an off-policy batch: token ratios differ within a turn
    calls = {}
    pool, surrogate = losses.pool_log_ratio, losses.clipped_surrogate

    def spy_pool(log_ratio, mask, level="token", turn_ids=None):
        calls["pool"] = (level, turn_ids, mask, pooled := pool(log_ratio, mask, level, turn_ids))
        return pooled

    def spy_surrogate(ratio, advantages, *args, **kwargs):
        calls["advantages"] = advantages
        return surrogate(ratio, advantages, *args, **kwargs)

    monkeypatch.setattr(losses, "pool_log_ratio", spy_pool)
    monkeypatch.setattr(losses, "clipped_surrogate", spy_surrogate)
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer.compute_loss(trainer.model, batch)
    assert torch.isfinite(loss)
    level, turn_ids, mask, pooled = calls["pool"]
    assert level == "turn"
    loss_mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    assert torch.equal(turn_ids[loss_mask], turn_ids_from_tool_mask(loss_mask.long())[loss_mask])
    for row in range(8):
        for turn in turn_ids[row][loss_mask[row]].unique():
            in_turn = loss_mask[row] & (turn_ids[row] == turn)
            values = pooled[row][in_turn]
            torch.testing.assert_close(values, torch.full_like(values, -noise[row][in_turn].mean().item()))
    assert torch.equal(calls["advantages"], batch["advantages"])  # (B, T): the per-turn advantages


@pytest.mark.slow
def test_multi_turn_training_steps_move_the_model(tmp_path, tiny_model_dir):
    trainer = tool_trainer(tmp_path, tiny_model_dir, max_steps=2)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(entry["tools/call_frequency"] == 0.75 for entry in logs)
    assert all(torch.isfinite(torch.tensor(entry["loss"])) for entry in logs)
    assert any((p.detach() != b).any() for p, b in zip(trainer.model.parameters(), before, strict=True))


def test_turn_advantages_need_a_per_turn_reward_function(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    with pytest.raises(ValueError, match="`turn_advantages`"):
        GRPOHubTrainer(
            model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
            reward_funcs=[answer_reward],
            tools=[add],
            train_dataset=load_tool_dataset(8),
            processing_class=tool_tokenizer(tiny_model_dir),
            args=GRPOHubConfig(
                output_dir=str(tmp_path),
                turn_advantages="turn",
                per_device_train_batch_size=8,
                num_generations=4,
                **CPU,
            ),
        )


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"turn_advantages": "token"}, "turn_advantages"),
        ({"turn_advantages": "turn", "whiten_advantages": True}, "whiten_advantages"),
        ({"turn_advantages": "turn", "reward_clip": 1.0}, "reward_clip"),
    ],
)
def test_bad_turn_advantage_settings_name_the_field(tmp_path, overrides, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        GRPOHubConfig(output_dir=str(tmp_path), **CPU, **overrides)
