"""Zero-signal filtering: dropped rows get no training forward, rows are dropped after TRL's split, nothing breaks.

That the "all" denominator gives TRL's training is a promise of tests/training/test_equivalence.py."""

from collections import defaultdict

import pytest
import torch
from trl.trainer.utils import split_tensor_dict

from grpo_hub.algos.filtering import agreed_row_count, keep_rows, micro_step_row_counts
from grpo_hub.training.filtering import SIGNAL_ROWS, drop_micro_batch_rows
from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import constant_reward, half_signal_dataset, half_signal_reward, make_trainer, tiny_config

SETTINGS = {"gradient_accumulation_steps": 2, "shuffle_dataset": False}


def half_signal_trainer(tmp_path, model_dir, **overrides):
    args = tiny_config(tmp_path, **{**SETTINGS, **overrides})
    return make_trainer(
        GRPOHubTrainer, model_dir, args, reward_funcs=[half_signal_reward], dataset=half_signal_dataset()
    )


def test_agreed_row_count():
    assert agreed_row_count(0, 4) == 4
    assert agreed_row_count(5, 4) == 8
    assert agreed_row_count(8, 4) == 8
    assert agreed_row_count(1, 1) == 1


def test_keep_rows_pads_and_trims():
    batch = {
        "prompt_ids": torch.tensor([[0, 5], [6, 7], [0, 8]]),
        "prompt_mask": torch.tensor([[0, 1], [1, 1], [0, 1]]),
        "completion_ids": torch.tensor([[1, 2, 0], [3, 4, 5], [6, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]]),
        "advantages": torch.tensor([1.0, 2.0, 3.0]),
        "num_items_in_batch": torch.tensor(6),
    }
    out = keep_rows(batch, torch.tensor([True, False, True]), num_rows=4)
    assert out["advantages"].tolist() == [1.0, 3.0, 0.0, 0.0]
    assert out["completion_mask"].tolist() == [[1, 1], [1, 0], [0, 0], [0, 0]]  # column 3 only used by row 1
    assert out["completion_ids"].tolist() == [[1, 2], [6, 0], [1, 2], [1, 2]]
    assert out["prompt_ids"].tolist() == [[5], [8], [5], [5]]  # left pad column trimmed
    assert out["num_items_in_batch"] is batch["num_items_in_batch"]
    with pytest.raises(ValueError, match="num_rows"):
        keep_rows(batch, torch.tensor([True, True, True]), num_rows=2)


def test_filtered_rows_get_no_training_forward(tmp_path, tiny_model_dir):
    seen = {True: [], False: []}
    for filtering in (True, False):
        trainer = half_signal_trainer(tmp_path, tiny_model_dir, filter_zero_signal=filtering, max_steps=3)

        def record(module, args, kwargs, filtering=filtering, tokenizer=trainer.processing_class):
            if torch.is_grad_enabled():
                seen[filtering].extend(tokenizer.batch_decode(kwargs["input_ids"]))

        trainer.model.register_forward_pre_hook(record, with_kwargs=True)
        trainer.train()
    # 3 optimizer steps x 2 micro-steps; 16 rows per generation, half of them in zero-signal groups
    assert len(seen[False]) == 3 * 16
    assert len(seen[True]) == 3 * 8
    assert sum("Stay quiet" in text for text in seen[False]) == 3 * 8
    assert not any("Stay quiet" in text for text in seen[True])


def test_filter_metrics(tmp_path, tiny_model_dir):
    trainer = half_signal_trainer(tmp_path, tiny_model_dir, filter_zero_signal=True, max_steps=2)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "zero_signal/rows_trained" in h]
    assert [h["zero_signal/rows_trained"] for h in logs] == [8.0, 8.0]
    assert [h["zero_signal/frac_rows_dropped"] for h in logs] == [0.5, 0.5]


def micro_batches(trainer) -> list[dict]:
    """One scored generation batch split the way TRL splits it (no shuffle), zero-signal rows dropped per
    micro-batch as the trainer drops them after TRL's split."""
    inputs = [trainer.train_dataset[i] for i in range(4) for _ in range(trainer.num_generations)]
    torch.manual_seed(0)
    trainer.model.train()
    batches = split_tensor_dict(
        trainer._generate_and_score_completions(inputs), trainer.args.steps_per_generation
    )
    if SIGNAL_ROWS not in batches[0]:
        return batches
    return drop_micro_batch_rows(
        batches, gather=lambda t: t, num_processes=1, pad_to_multiple_of=None, metrics=defaultdict(list)
    )


def window_grads(trainer, batches):
    """Gradient of one accumulation window over the micro-batches."""
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    trainer.model.zero_grad()
    for micro in batches:
        trainer.compute_loss(trainer.model, micro).backward()
    return torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters() if p.grad is not None])


def test_rows_are_dropped_after_trls_split_and_marked_before(tmp_path, tiny_model_dir):
    trainer = half_signal_trainer(tmp_path, tiny_model_dir, filter_zero_signal=True)
    inputs = [trainer.train_dataset[i] for i in range(4) for _ in range(trainer.num_generations)]
    trainer.model.train()
    scored = trainer._generate_and_score_completions(inputs)
    # every row reaches TRL's shuffle (same permutation size, same RNG draws as TRL), marked by group signal
    assert scored["prompt_ids"].shape[0] == 16
    assert scored[SIGNAL_ROWS].tolist() == [True] * 4 + [False] * 4 + [True] * 4 + [False] * 4
    metrics = defaultdict(list)
    mixed = {**scored, SIGNAL_ROWS: torch.tensor([True, False] * 4 + [False] * 8)}  # 4 kept, then none
    out = drop_micro_batch_rows(
        split_tensor_dict(mixed, 2),
        gather=lambda t: t,
        num_processes=1,
        pad_to_multiple_of=None,
        metrics=metrics,
    )
    assert [b["prompt_ids"].shape[0] for b in out] == [4, 1]  # the second trains one zero-loss pad row
    assert out[1]["completion_mask"].sum() == 0 and SIGNAL_ROWS not in out[0]
    assert out[0]["advantages"].tolist() == scored["advantages"][[0, 2, 4, 6]].tolist()
    assert int(out[0]["num_items_in_batch"]) == int(scored["completion_mask"][[0, 2, 4, 6]].sum())
    assert [float(out[1][k]) for k in ("kept_rows", "all_rows")] == [4.0, 16.0]
    assert metrics["zero_signal/rows_padded"] == [1.0] and metrics["zero_signal/frac_rows_dropped"] == [0.75]


def test_micro_step_row_counts():
    kept = torch.tensor([[3, 0, 2], [1, 0, 4]])  # 2 ranks x 3 micro-steps
    assert micro_step_row_counts(kept).tolist() == [3, 1, 4]
    with pytest.raises(ValueError, match="ranks, micro-steps"):
        micro_step_row_counts(torch.tensor([1, 2]))


@pytest.mark.parametrize("loss", [{"loss_type": "dapo"}, {"loss_type": "grpo"}], ids=str)
def test_kept_denominator_renormalises_over_surviving_rows(tmp_path, tiny_model_dir, loss):
    off = half_signal_trainer(tmp_path, tiny_model_dir, **loss)
    on = half_signal_trainer(tmp_path, tiny_model_dir, filter_zero_signal=True, **loss)
    batch_off, batch_on = micro_batches(off), micro_batches(on)
    grads_off, grads_on = window_grads(off, batch_off), window_grads(on, batch_on)
    if loss["loss_type"] == "dapo":  # token mean over the kept tokens instead of all tokens
        factor = batch_off[0]["num_items_in_batch"] / batch_on[0]["num_items_in_batch"]
    else:  # sequence mean over the 8 kept rows instead of all 16
        factor = 2.0
    assert factor > 1
    torch.testing.assert_close(grads_on, grads_off * factor, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "loss",
    [
        {"loss_type": "dapo"},
        {"loss_type": "grpo"},
        {"loss_type": "grpo", "loss_agg_mode": "seq-mean-token-sum"},
    ],
    ids=str,
)
def test_all_filtered_batch_neither_crashes_nor_moves_the_model(tmp_path, tiny_model_dir, loss):
    args = tiny_config(tmp_path, filter_zero_signal=True, max_steps=2, **SETTINGS, **loss)
    trainer = make_trainer(GRPOHubTrainer, tiny_model_dir, args, reward_funcs=[constant_reward])
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["zero_signal/rows_trained"] for h in logs] == [0.0, 0.0]
    assert all(h["loss"] == 0.0 and h["grad_norm"] == 0.0 for h in logs)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def clipped_flat_reward(prompts, completions, completion_ids, **kwargs):
    """'Stay quiet' prompts: 5 or 10 by completion (raw spread 5, clipped to 1.0 by reward_clip=1); others graded."""
    return [
        (5.0 if sum(ids) % 2 else 10.0) if p.startswith("Stay") else (sum(ids) % 7) / 7 - 0.5
        for p, ids in zip(prompts, completion_ids, strict=True)
    ]


def test_zero_signal_is_decided_after_reward_clip(tmp_path, tiny_model_dir):
    """docs/filtering.md: zero-signal groups are found from the rewards the advantages use (after reward_clip)."""
    dropped = {}
    for clip in (None, 1.0):
        args = tiny_config(tmp_path, **SETTINGS, filter_zero_signal=True, reward_clip=clip, max_steps=2)
        trainer = make_trainer(
            GRPOHubTrainer,
            tiny_model_dir,
            args,
            reward_funcs=[clipped_flat_reward],
            dataset=half_signal_dataset(),
        )
        trainer.train()
        dropped[clip] = [
            h["zero_signal/frac_rows_dropped"]
            for h in trainer.state.log_history
            if "zero_signal/frac_rows_dropped" in h
        ]
    assert dropped[1.0] and all(share >= 0.5 for share in dropped[1.0])  # the quiet half is flat once clipped
    assert all(share < 0.5 for share in dropped[None])  # raw, the quiet half varies
