"""The equivalence suite: every promise that grpo_hub equals plain TRL, stated once and checked here.

Promises (README.md, docs/variants.md, docs/filtering.md, docs/reference-adapter.md, docs/selective-rollout.md,
docs/rollout-budget.md, docs/validation.md):

- DEFAULTS: with every new field at its default, GRPOHubTrainer gives TRL's batch, loss and gradient bit for
  bit, so training ends at TRL's weights bit for bit.
- MAPPED: the options documented as TRL's own (GSPO, CISPO with its preset cap, dual_clip_c -> delta) give TRL's
  loss and gradient bit for bit; the own loss path configured to TRL's denominators gives them to float rounding.
- FILTER_ALL: `filter_zero_signal` with `zero_signal_normalizer="all"`, packed or not, trains like TRL without
  filtering: every kept row trains in the optimizer step TRL gives it, the randomness drawn does not depend on
  the rows dropped, and the weights agree to float summation order (dropped rows would have contributed 0).
- NEUTRAL_UNTIL_IT_ACTS: a reference adapter kept or refreshed on a schedule that has not fired yet, and
  selective rollout before it has learned anything, change nothing: TRL bit for bit.
- HINTS_THAT_NEVER_FIRE: hint-guided rollouts on (`hint_column`) while no prompt is hinted (no window of
  completions has been decided yet) train like TRL bit for bit (docs/hints.md).
- EQUAL_BUDGETS: per-prompt rollout budgets held at num_generations (rollout_budget_min == rollout_budget_max)
  train like TRL bit for bit (docs/rollout-budget.md).
- REWARDS_READ_AS_TRL: list, array, tensor and async reward outputs, with None/NaN, score as in TRL.

The training promises are checked on a grid of batch layouts: steps_per_generation {1, 2, 4} x
gradient_accumulation_steps {1, 2, 3} x num_iterations {1, 2} x one or two reward functions x LoRA or full
fine-tuning. GRID's 9 layouts hold every pair of those values (a pairwise covering array; the full product is 72
layouts); each trains two generation cycles or more, with plain SGD, and the weights are compared at the end
(tests/training/equivalence_runs.py). On 2 gloo ranks (TWO_RANK_GRID, one launch) rank 1 drops every row.
"""

import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from grpo_hub.config import features
from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import make_trainer, scored_batch, tiny_config
from tests.training.equivalence_runs import NUM_GENERATIONS, Layout, logged_rewards, train, trained_weights
from tests.training.helpers import ALL_NORMALISER
from tests.training.helpers import run as run_probed

# (steps_per_generation, gradient_accumulation_steps, num_iterations, reward functions, LoRA)
GRID = [
    Layout(*values)
    for values in [
        (1, 1, 1, 1, False),
        (1, 2, 2, 2, True),
        (1, 3, 1, 2, True),
        (2, 1, 2, 2, False),
        (2, 2, 1, 1, True),
        (2, 3, 2, 1, False),
        (4, 1, 1, 2, True),
        (4, 2, 2, 1, False),
        (4, 3, 1, 1, False),
    ]
]
FAST = {
    "S4-GA2-it2-r1-full"
}  # issue 32's layout (steps_per_generation > accumulation) runs in the quick suite
TWO_RANK_GRID = [Layout(4, 2, 1, 2, False), Layout(2, 3, 2, 1, True), Layout(1, 2, 2, 2, False)]

FILTER_ALL = {"filter_zero_signal": True, "zero_signal_normalizer": "all"}
FILTER_VARIANTS = {"packed": FILTER_ALL, "thin": {**FILTER_ALL, "zero_signal_pack": False}}
REFERENCE_BETA = {"beta": 0.1}  # a reference adapter needs a KL term
REFERENCE_VARIANTS = {
    "keep": {"ref_adapter_keep": True},
    "refresh-not-due": {"ref_adapter_sync_on": "steps", "ref_adapter_sync_steps": 1000},
}
# float summation order only: dropped rows change the shapes the kept rows are computed in
FILTER_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def grid_params(layouts):
    return [
        pytest.param(layout, id=layout.name, marks=() if layout.name in FAST else pytest.mark.slow)
        for layout in layouts
    ]


@pytest.fixture(scope="module")
def trl_runs(tmp_path_factory, tiny_model_dir):
    """Plain TRL's (weights, rewards) per (layout, settings), trained once for the module."""
    cache = {}

    def run(layout: Layout, settings: dict) -> tuple[torch.Tensor, list[float]]:
        key = (layout, tuple(sorted(settings.items())))
        if key not in cache:
            trainer = train("trl", layout, settings, tmp_path_factory.mktemp("trl"), tiny_model_dir)
            cache[key] = trained_weights(trainer), logged_rewards(trainer)
        return cache[key]

    return run


def hub_run(tmp_path, model_dir, layout, settings):
    trainer = train("hub", layout, settings, tmp_path, model_dir)
    return trainer, trained_weights(trainer), logged_rewards(trainer)


# --- DEFAULTS ---
@pytest.mark.parametrize("layout", grid_params(GRID))
def test_defaults_train_like_trl(tmp_path, tiny_model_dir, trl_runs, layout):
    weights, rewards = trl_runs(layout, {})
    _, hub_weights, hub_rewards = hub_run(tmp_path, tiny_model_dir, layout, {})
    assert len(rewards) >= 2, "the run must span more than one generation batch"
    assert torch.equal(hub_weights, weights)
    assert hub_rewards == rewards


# --- FILTER_ALL ---
@pytest.mark.parametrize("variant", FILTER_VARIANTS)
@pytest.mark.parametrize("layout", grid_params(GRID))
def test_filtering_with_the_all_denominator_trains_like_trl(
    tmp_path, tiny_model_dir, trl_runs, layout, variant
):
    weights, rewards = trl_runs(layout, {})
    trainer, hub_weights, hub_rewards = hub_run(tmp_path, tiny_model_dir, layout, FILTER_VARIANTS[variant])
    dropped = [e["zero_signal/frac_rows_dropped"] for e in trainer.state.log_history if "reward" in e]
    assert dropped and all(share >= 0.5 for share in dropped), "the data must give filtering rows to drop"
    assert hub_rewards == rewards  # the same completions in every generation batch: the same random draws
    torch.testing.assert_close(hub_weights, weights, **FILTER_TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_NORMALISER)
def test_filtering_with_the_all_denominator_equals_no_filtering_with(tmp_path, tiny_model_dir, name):
    """FILTER_ALL beside every feature that allows it: the gradient of grpo_hub without filtering, same feature."""
    example = {
        **features.SWITCHES[name].example,
        "learning_rate": 0.0,
        "max_steps": 1,
        "gradient_accumulation_steps": 2,
    }
    plain = run_probed(tmp_path, tiny_model_dir, **example)
    filtered = run_probed(tmp_path, tiny_model_dir, **FILTER_ALL, **example)
    assert plain.grads and all(g.abs().sum() > 0 for g in plain.grads)
    for a, b in zip(filtered.grads, plain.grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


# --- NEUTRAL_UNTIL_IT_ACTS ---
@pytest.mark.parametrize("variant", REFERENCE_VARIANTS)
@pytest.mark.parametrize("layout", grid_params([layout for layout in GRID if layout.peft]))
def test_reference_adapter_changes_nothing_until_it_acts(tmp_path, tiny_model_dir, trl_runs, layout, variant):
    """A fresh LoRA's "ref" copy is the base model, TRL's reference: before a refresh nothing may differ (issue 32:
    building the adapter drew from the global RNG, so every completion differed)."""
    weights, rewards = trl_runs(layout, REFERENCE_BETA)
    settings = {**REFERENCE_BETA, **REFERENCE_VARIANTS[variant]}
    trainer, hub_weights, hub_rewards = hub_run(tmp_path, tiny_model_dir, layout, settings)
    assert "ref" in trainer.model.peft_config
    assert torch.equal(hub_weights, weights)
    assert hub_rewards == rewards


# --- HINTS_THAT_NEVER_FIRE ---
@pytest.mark.parametrize("layout", grid_params(GRID))
def test_hints_while_no_prompt_is_hinted_train_like_trl(tmp_path, tiny_model_dir, trl_runs, layout):
    weights, rewards = trl_runs(layout, {})
    settings = {"hint_column": "solution", "hint_window": 10**9}  # no length is ever decided: no hint
    trainer, hub_weights, hub_rewards = hub_run(tmp_path, tiny_model_dir, layout, settings)
    assert trainer._hints.counts and not any(trainer._hints.lengths.values()), "hints never ran, or fired"
    assert torch.equal(hub_weights, weights)
    assert hub_rewards == rewards


# --- EQUAL_BUDGETS ---
EQUAL_BUDGETS = {
    "rollout_budget": "knapsack",
    "rollout_budget_min": NUM_GENERATIONS,
    "rollout_budget_max": NUM_GENERATIONS,
}


@pytest.mark.parametrize("layout", grid_params(GRID))
def test_rollout_budgets_of_num_generations_train_like_trl(tmp_path, tiny_model_dir, trl_runs, layout):
    weights, rewards = trl_runs(layout, {})
    trainer, hub_weights, hub_rewards = hub_run(tmp_path, tiny_model_dir, layout, EQUAL_BUDGETS)
    assert trainer._budgets.history, "the budgets never ran"
    assert torch.equal(hub_weights, weights)
    assert hub_rewards == rewards


def test_selective_rollout_before_it_has_learned_gives_trls_batch(tmp_path, tiny_model_dir):
    plain = make_trainer(GRPOTrainer, tiny_model_dir, tiny_config(tmp_path, GRPOConfig))
    hub = make_trainer(GRPOHubTrainer, tiny_model_dir, tiny_config(tmp_path, selective_rollout=True))
    plain_batch, hub_batch = scored_batch(plain), scored_batch(hub)
    for key, value in plain_batch.items():
        assert torch.equal(value, hub_batch[key]), key


# --- DEFAULTS and MAPPED on one batch: the loss and gradient of each TRL loss ---
def vary_lengths(batch):
    """Cut row i after 1 + i % 8 tokens, so that token-mean and sequence-mean denominators differ."""
    mask = batch["completion_mask"].clone()
    lengths = 1 + torch.arange(mask.shape[0]) % mask.shape[1]
    mask[torch.arange(mask.shape[1])[None, :] >= lengths[:, None]] = 0
    return {**batch, "completion_mask": mask, "num_items_in_batch": mask.sum()}


def loss_and_grads(trainer, batch, accumulation=1):
    trainer.current_gradient_accumulation_steps = accumulation
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


CASES = [
    ({}, {}),
    ({"loss_type": "grpo"}, {"loss_type": "grpo"}),
    ({"loss_type": "bnpo"}, {"loss_type": "bnpo"}),
    ({"loss_type": "dr_grpo"}, {"loss_type": "dr_grpo"}),
    ({"loss_type": "cispo", "epsilon_high": 5.0}, {"loss_type": "cispo"}),
    ({"loss_type": "grpo", "importance_sampling_level": "sequence"}, {"loss_type": "gspo", "epsilon": 0.2}),
    ({"loss_type": "dapo", "beta": 0.1}, {"loss_type": "dapo", "beta": 0.1}),
    ({"delta": 3.0}, {"dual_clip_c": 3.0}),
    # the own loss path, configured to TRL's denominators, must reproduce TRL's loss and gradient
    ({"loss_type": "grpo"}, {"loss_type": "grpo", "loss_agg_mode": "seq-mean-token-mean"}),
    ({"loss_type": "dapo"}, {"loss_type": "dapo", "loss_agg_mode": "token-mean"}),
    ({"loss_type": "dapo", "beta": 0.1}, {"loss_type": "dapo", "beta": 0.1, "loss_agg_mode": "token-mean"}),
    ({"loss_type": "dr_grpo"}, {"loss_type": "grpo", "loss_agg_mode": "seq-mean-token-sum-norm"}),
    ({"loss_type": "cispo", "epsilon_high": 5.0}, {"loss_type": "cispo", "loss_agg_mode": "token-mean"}),
]


@pytest.mark.parametrize(("trl_kwargs", "hub_kwargs"), CASES, ids=[str(h) for _, h in CASES])
def test_matches_plain_trl_on_the_same_batch(tmp_path, tiny_model_dir, trl_kwargs, hub_kwargs):
    plain = make_trainer(GRPOTrainer, tiny_model_dir, tiny_config(tmp_path, GRPOConfig, **trl_kwargs))
    hub = make_trainer(GRPOHubTrainer, tiny_model_dir, tiny_config(tmp_path, **hub_kwargs))
    plain_batch, hub_batch = scored_batch(plain), scored_batch(hub)
    for key, value in plain_batch.items():
        assert torch.equal(value, hub_batch[key]), key
    plain_loss, plain_grads = loss_and_grads(plain, vary_lengths(plain_batch))
    hub_loss, hub_grads = loss_and_grads(hub, vary_lengths(hub_batch))
    assert plain_grads and any(g.abs().sum() > 0 for g in plain_grads)
    own_path = "loss_agg_mode" in hub_kwargs
    for ours, theirs in zip([hub_loss, *hub_grads], [plain_loss, *plain_grads], strict=True):
        if own_path:  # same maths, different operation order
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
        else:
            assert torch.equal(ours, theirs)


# --- REWARDS_READ_AS_TRL ---
def test_array_tensor_and_async_rewards_score_as_in_plain_trl(tmp_path, tiny_model_dir):
    def array_reward(completion_ids, **kwargs):
        return np.array([float(sum(ids) % 5) for ids in completion_ids])

    def tensor_reward(completion_ids, **kwargs):
        return torch.tensor(
            [float(len(ids) % 3) if i % 3 else math.nan for i, ids in enumerate(completion_ids)]
        )

    async def async_reward(completion_ids, **kwargs):
        return [float(ids[0] % 2) if i % 4 else None for i, ids in enumerate(completion_ids)]

    funcs = [array_reward, tensor_reward, async_reward]
    data = Dataset.from_dict({"prompt": [f"Write only digits: {i}" for i in range(8)]})
    plain = make_trainer(GRPOTrainer, tiny_model_dir, tiny_config(tmp_path, GRPOConfig), funcs, data)
    hub = make_trainer(GRPOHubTrainer, tiny_model_dir, tiny_config(tmp_path), funcs, data)
    plain_batch, hub_batch = scored_batch(plain), scored_batch(hub)
    assert torch.equal(plain_batch["advantages"], hub_batch["advantages"])
    for name in ("array_reward", "tensor_reward", "async_reward"):
        assert (
            plain._metrics["train"][f"rewards/{name}/mean"] == hub._metrics["train"][f"rewards/{name}/mean"]
        )


# --- 2 gloo ranks ---
@pytest.fixture(scope="module")
def two_rank_runs():
    """{(layout name, variant): per-rank results} of every TWO_RANK_GRID run, trained in one 2-rank launch."""
    from tests.training.distributed.equivalence_worker import run_grid

    return run_grid(TWO_RANK_GRID, {"trl": None, "defaults": {}, **FILTER_VARIANTS})


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("layout", TWO_RANK_GRID, ids=lambda layout: layout.name)
def test_two_ranks_train_like_trl(two_rank_runs, layout):
    """DEFAULTS and FILTER_ALL on 2 ranks, rank 1 dropping every row of every generation batch (it trains pad rows
    only, padded to rank 0's count in each micro-step)."""
    trl = two_rank_runs[layout.name, "trl"]
    for rank in trl:
        assert rank["world_size"] == 2 and rank["backend"] == "gloo"
    assert len(trl[0]["rewards"]) >= 2
    assert torch.equal(trl[0]["weights"], trl[1]["weights"])
    defaults = two_rank_runs[layout.name, "defaults"]
    assert torch.equal(defaults[0]["weights"], trl[0]["weights"])
    assert defaults[0]["rewards"] == trl[0]["rewards"]
    for variant in FILTER_VARIANTS:
        filtered = two_rank_runs[layout.name, variant]
        assert all(share >= 0.75 for share in filtered[0]["frac_rows_dropped"]), "rank 1 must drop every row"
        assert filtered[0]["rewards"] == trl[0]["rewards"]
        torch.testing.assert_close(filtered[0]["weights"], trl[0]["weights"], **FILTER_TOLERANCE)
        assert torch.equal(filtered[0]["weights"], filtered[1]["weights"])
