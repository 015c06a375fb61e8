"""Resuming with dynamic sampling or selective rollout, where a step reads more than one generation batch: from a
checkpoint in the middle of the 2nd epoch or at the end of an epoch, the resumed run is the uninterrupted run."""

import os

import pytest
import torch

from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import make_trainer, tiny_config
from tests.training.selective.graded import graded_dataset, graded_reward

# 16 rows per generation batch = 4 groups of 4; 32 prompts = 8 generation batches per epoch, a quarter of the
# prompts informative: a step reads about 4 generation batches, an epoch lasts about 2 steps (transformers: 8).
SETTINGS = {"per_device_train_batch_size": 16, "num_train_epochs": 3, "max_steps": -1}
SELECTIVE = {"selective_rollout": True, "selective_rollout_id_column": "index"}


def recording_trainer(tmp_path, model_dir, **overrides):
    """A trainer on the graded task whose reward records (global step, prompt index) of every scored group."""
    args = tiny_config(tmp_path, **{**SETTINGS, "dynamic_sampling": True, **overrides})
    scored: list[tuple[int, int]] = []

    def reward(prompts, completions, completion_ids, index, **kwargs):
        scored.extend((trainer.state.global_step, i) for i in index[:: args.num_generations])
        return graded_reward(prompts, completions, completion_ids)

    trainer = make_trainer(GRPOHubTrainer, model_dir, args, reward_funcs=[reward], dataset=graded_dataset(32))
    return trainer, scored


def checkpoints(trainer) -> dict[str, int]:
    """Steps of the uninterrupted run: one inside the 2nd epoch (not its last), and the 2nd epoch's last."""
    epoch = {entry["step"]: int(entry["epoch"]) for entry in trainer.state.log_history if "loss" in entry}
    second = [step for step in sorted(epoch) if epoch[step] == 1]
    assert len(second) >= 2 and epoch.get(second[-1] + 1) == 2, f"the 2nd epoch is not as planned: {epoch}"
    return {"mid-epoch": second[0], "epoch end": second[-1]}


@pytest.mark.parametrize("selective", [False, True], ids=["dynamic", "selective+dynamic"])
def test_a_run_resumed_mid_epoch_or_at_an_epoch_end_continues_as_the_uninterrupted_run(
    tmp_path, tiny_model_dir, selective
):
    extra = SELECTIVE if selective else {}
    full, full_scored = recording_trainer(
        tmp_path / "full", tiny_model_dir, save_strategy="steps", save_steps=1, **extra
    )
    full.train()
    for kind, step in checkpoints(full).items():
        resumed, scored = recording_trainer(tmp_path / kind, tiny_model_dir, **extra)
        resumed.train(resume_from_checkpoint=str(tmp_path / "full" / f"checkpoint-{step}"))
        assert scored == [(s, prompt) for s, prompt in full_scored if s >= step], kind  # same prompts, order
        assert resumed.state.global_step == full.state.global_step, kind
        weights = zip(resumed.model.state_dict().values(), full.model.state_dict().values(), strict=True)
        assert all(torch.equal(a, b) for a, b in weights), f"{kind}: same data, RNG and updates"
        if selective:
            decisions = list(resumed._selector.decisions)
            assert decisions == list(full._selector.decisions)[-len(decisions) :], kind
            assert any(skip for _, skip in decisions), f"{kind}: nothing skipped, the test checks nothing"


def test_a_checkpoint_without_the_stream_position_is_refused(tmp_path, tiny_model_dir):
    first, _ = recording_trainer(tmp_path, tiny_model_dir, max_steps=1, save_strategy="steps", save_steps=1)
    first.train()
    checkpoint = tmp_path / "checkpoint-1"
    os.remove(checkpoint / "batch_stream.pt")
    resumed, _ = recording_trainer(tmp_path, tiny_model_dir, max_steps=2)
    with pytest.raises(ValueError, match="batch_stream.pt.*ignore_data_skip=True"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    resumed, _ = recording_trainer(tmp_path, tiny_model_dir, max_steps=2, ignore_data_skip=True)
    resumed.train(resume_from_checkpoint=str(checkpoint))  # the escape hatch: transformers' position
    assert resumed.state.global_step == 2
