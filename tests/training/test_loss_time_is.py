"""vLLM's IS ratio from the training forward (grpo_hub/generation/loss_time_is.py): the rule that decides where it is
exact, the weights and diagnostics against naive implementations, and training runs on TRL's vLLM path (the stand-in
sampler of tests/training/vllm_stand_in.py) that must equal TRL's scoring-forward path while running no scoring
forward. Tolerance: the training forward computes a row's log-probs in another batch than TRL's scoring forward
(micro-batch instead of chunk, other rows, other order), so fp32 reductions may round differently, ~1e-7 relative per
log-prob; a few SGD steps at lr 0.2 keep weights within 1e-5, and the logged metrics (float64 sums here, float32 means
in TRL) within 1e-5 relative. The runs below came out bit-identical in weights on this machine."""

import math
import random
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from grpo_hub.config.vllm_checks import is_path_line, scoring_forward_reason
from grpo_hub.generation.loss_time_is import LossTimeIS
from tests.training import equivalence_runs as er

IS_PREFIXES = ("sampling/", "vllm_is/")
CLOSE = {"rtol": 1e-5, "atol": 1e-6}


# --- the rule ---
def rule_config(**changes):
    base = {
        "num_iterations": 1,
        "steps_per_generation": 2,
        "gradient_accumulation_steps": 2,
        "loss_type": "dapo",
    }
    return SimpleNamespace(**{**base, **changes})


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, None),
        (
            {"steps_per_generation": 1, "gradient_accumulation_steps": 4},
            None,
        ),  # 4 generation batches per step
        ({"num_iterations": 2, "gradient_accumulation_steps": 4}, "num_iterations=2"),
        ({"steps_per_generation": 4}, "steps_per_generation=4 does not divide gradient_accumulation_steps=2"),
        (
            {"steps_per_generation": 3, "gradient_accumulation_steps": 4},
            "a generation batch spans optimizer steps",
        ),
        ({"loss_type": "vespo"}, "vespo"),
    ],
)
def test_the_rule_takes_the_ratio_from_the_training_forward_only_where_exact(changes, reason):
    config = rule_config(**changes)
    got = scoring_forward_reason(config)
    assert got is None if reason is None else reason in got
    line = is_path_line(got)
    assert ("no scoring forward" in line) == (reason is None) and "\n" not in line


# --- weights and diagnostics against naive implementations ---
def naive_trl_ratio(trainer, sampler, mask, mode, low, high):
    """TRL 1.16's vLLM IS ratio, element by element: Δ = (old - sampling) on masked-in tokens, 0 for NaN or masked-out;
    token modes exp(Δ_t), sequence modes exp(ΣΔ); truncate clamps, mask zeroes outside [low, high]."""
    rows, width = trainer.shape
    deltas = [
        [
            0.0 if not mask[r, t] or math.isnan(sampler[r, t]) else float(trainer[r, t] - sampler[r, t])
            for t in range(width)
        ]
        for r in range(rows)
    ]
    if mode.startswith("sequence"):
        values = [[math.exp(sum(row))] for row in deltas]
    else:
        values = [[math.exp(d) for d in row] for row in deltas]
    lo, hi = -math.inf if low is None else low, math.inf if high is None else high
    if mode.endswith("truncate"):
        values = [[min(max(v, lo), hi) for v in row] for row in values]
    else:
        values = [[0.0 if v < lo or v > hi else v for v in row] for row in values]
    return torch.tensor(values, dtype=torch.float64)


def random_batch(rng: random.Random, rows=5, width=6):
    trainer = torch.tensor([[rng.uniform(-4, -0.1) for _ in range(width)] for _ in range(rows)])
    sampler = trainer + torch.tensor([[rng.uniform(-0.3, 0.3) for _ in range(width)] for _ in range(rows)])
    sampler[torch.rand(rows, width, generator=torch.Generator().manual_seed(rng.randrange(10**6))) < 0.15] = (
        math.nan
    )
    mask = torch.ones(rows, width, dtype=torch.long)
    for r in range(rows):
        mask[r, rng.randrange(0, width + 1) :] = 0  # includes an empty row now and then
    return trainer, sampler, mask


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize(("low", "high"), [(None, 3.0), (0.9, 1.1), (0.5, None)])
def test_weights_are_trls_ratio_from_the_given_log_probs(mode, low, high):
    rng = random.Random(hash((mode, low, high)) % 1000)
    for _ in range(20):
        trainer, sampler, mask = random_batch(rng)
        loss_time = LossTimeIS(trl_mode=mode, pooling=None, low=low, high=high, gather=None, metrics=None)
        inputs = {"completion_mask": mask, "sampling_per_token_logps": sampler}
        got = loss_time.weights(inputs, trainer.requires_grad_())
        assert not got.requires_grad
        expected = naive_trl_ratio(trainer.detach(), sampler, mask, mode, low, high)
        torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=0)


def naive_trl_metrics(rank_batches, mode):
    """TRL's sampling/* metrics over ranks, each rank's rows being the concatenation of its micro-batches."""
    means, maxes, rmins, rmeans, rmaxes = [], [], [], [], []
    for batches in rank_batches:
        deltas, ratios = [], []
        for trainer, sampler, mask in batches:
            ratio = naive_trl_ratio(trainer, sampler, mask, mode, None, 3.0)
            for r in range(trainer.shape[0]):
                for t in range(trainer.shape[1]):
                    if mask[r, t] and not math.isnan(sampler[r, t]):
                        deltas.append(abs(float(trainer[r, t] - sampler[r, t])))
                    if mode.startswith("token") and mask[r, t]:
                        ratios.append(float(ratio[r, t]))
                if mode.startswith("sequence"):
                    ratios.append(float(ratio[r, 0]))
        means.append(sum(deltas) / len(deltas) if deltas else 0.0)
        maxes.append(max(deltas, default=0.0))
        rmins.append(min(ratios, default=0.0))
        rmeans.append(sum(ratios) / len(ratios) if ratios else 0.0)
        rmaxes.append(max(ratios, default=0.0))
    return {
        "sampling/sampling_logp_difference/mean": sum(means) / len(means),
        "sampling/sampling_logp_difference/max": max(maxes),
        "sampling/importance_sampling_ratio/min": min(rmins),
        "sampling/importance_sampling_ratio/mean": sum(rmeans) / len(rmeans),
        "sampling/importance_sampling_ratio/max": max(rmaxes),
    }


@pytest.mark.parametrize("mode", ["token_mask", "sequence_truncate"])
def test_diagnostics_sum_micro_batches_then_aggregate_ranks_as_trl(mode):
    rng = random.Random(7)
    rank_batches = [[random_batch(rng) for _ in range(3)] for _ in range(2)]
    ranks = []
    for batches in rank_batches:
        loss_time = LossTimeIS(trl_mode=mode, pooling=None, low=None, high=3.0, gather=None, metrics=None)
        for trainer, sampler, mask in batches:
            loss_time.weights({"completion_mask": mask, "sampling_per_token_logps": sampler}, trainer)
        ranks.append(loss_time)
    per_rank = torch.stack([r.pending() for r in ranks])
    metrics = defaultdict(list)
    ranks[0]._gather, ranks[0]._metrics = (lambda mine: per_rank), metrics
    ranks[0].flush()
    for name, value in naive_trl_metrics(rank_batches, mode).items():
        assert metrics[name] == [pytest.approx(value, rel=1e-6)], name
    assert "vllm_is/abs_logp_diff_mean" in metrics and ranks[0]._sums is None
    ranks[0].flush()  # nothing pending: logs nothing
    assert all(len(values) == 1 for values in metrics.values())


# --- training on TRL's vLLM path (stand-in sampler), against TRL's scoring forward ---
def run(tmp_path, model_dir, kind, layout, settings, loss_time, **is_settings):
    vllm_is = {"loss_time": loss_time, **is_settings}
    name = f"{kind}-{loss_time}-{len(list(tmp_path.iterdir()))}"
    trainer = er.train(kind, layout, settings, tmp_path / name, model_dir, vllm_is=vllm_is)
    logs = [
        {k: v for k, v in e.items() if k.startswith(IS_PREFIXES) or k == "loss"}
        for e in trainer.state.log_history
    ]
    return {
        "weights": er.trained_weights(trainer),
        "logs": [e for e in logs if e],
        "scoring_forwards": trainer.scoring_forwards.count,
    }


ALIGNED = er.Layout(2, 2, 1, 1, False)
CASES = {  # name: (layout, config settings, stand-in IS settings, baseline: plain "trl" or grpo_hub's TRL path "hub")
    "sequence_mask (TRL's default)": (ALIGNED, {}, {}, "trl"),
    "token_truncate": (ALIGNED, {}, {"mode": "token_truncate", "low": 0.97, "high": 1.03}, "trl"),
    "token_mask": (ALIGNED, {}, {"mode": "token_mask", "low": 0.97, "high": 1.03}, "trl"),
    "sequence_truncate": (ALIGNED, {}, {"mode": "sequence_truncate", "low": 0.9, "high": 1.1}, "trl"),
    "GSPO": (ALIGNED, {"importance_sampling_level": "sequence"}, {}, "trl"),
    "CISPO": (ALIGNED, {"loss_type": "cispo", "epsilon_high": 5.0}, {}, "trl"),
    "4 generation batches a step": (er.Layout(1, 4, 1, 2, False), {}, {}, "trl"),
    "geometric pooling": (
        ALIGNED,
        {},
        {"mode": "sequence_truncate", "low": 0.9, "high": 1.1, "pooling": "mean"},
        "hub",
    ),
    # grpo_hub's own loss (the path of turn-level ratios, which need multi-turn rollouts: tests/training/vllm)
    "own loss (loss_agg_mode)": (ALIGNED, {"loss_agg_mode": "seq-mean-token-sum"}, {}, "hub"),
    "filtering + packing": (ALIGNED, {"filter_zero_signal": True}, {}, "hub"),
    "dynamic sampling": (
        er.Layout(2, 2, 1, 1, False, prompts_factor=3),
        {"dynamic_sampling": True},
        {},
        "hub",
    ),
    "reference adapter": (
        er.Layout(2, 2, 1, 1, True),
        {"beta": 0.04, "ref_adapter_sync_on": "steps", "ref_adapter_sync_steps": 1},
        {},
        "hub",
    ),
}
# diagnostics cover the rows trained (grpo_hub/generation/loss_time_is.py): not the zero-signal rows filtering drops,
# nor those of dynamic sampling's rounds (TRL's path logs every round it scored)
ROWS_DROPPED = {"filtering + packing", "dynamic sampling"}


@pytest.mark.parametrize("case", list(CASES))
def test_the_ratio_from_the_training_forward_trains_like_trls_scoring_forward(tmp_path, tiny_model_dir, case):
    layout, settings, is_settings, baseline = CASES[case]
    base = run(tmp_path, tiny_model_dir, baseline, layout, settings, False, **is_settings)
    mine = run(tmp_path, tiny_model_dir, "hub", layout, settings, True, **is_settings)
    # what stays: TRL's reference forward (beta != 0), one per chunk like the scoring forward it ran beside
    left = base["scoring_forwards"] // 2 if settings.get("beta") else 0
    assert base["scoring_forwards"] > left and mine["scoring_forwards"] == left
    torch.testing.assert_close(mine["weights"], base["weights"], **CLOSE)
    assert len(mine["logs"]) == len(base["logs"]) >= 2
    for theirs, ours in zip(base["logs"], mine["logs"], strict=True):
        # a loss is a mean of ±advantage x ratio terms that cancel: rounding of the log-probs shows absolutely
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-5)
        if case in ROWS_DROPPED:
            continue
        assert set(theirs) <= set(ours) and (baseline == "trl" or set(ours) == set(theirs))
        for key, value in theirs.items():
            if key != "loss":
                assert ours[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_the_ratio_matters_so_the_equality_is_not_vacuous(tmp_path, tiny_model_dir):
    """The stand-in's IS weights move the update: without the correction the same run ends elsewhere."""
    with_ratio = run(
        tmp_path, tiny_model_dir, "hub", ALIGNED, {}, True, mode="token_truncate", low=0.97, high=1.03
    )
    trainer = er.train("hub", ALIGNED, {}, tmp_path / "plain", tiny_model_dir)
    assert (er.trained_weights(trainer) - with_ratio["weights"]).abs().max() > 1e-4


@pytest.mark.parametrize(
    "layout", [er.Layout(2, 4, 2, 1, False), er.Layout(4, 2, 1, 1, False)], ids=lambda layout: layout.name
)
def test_where_not_exact_trls_scoring_forward_runs(tmp_path, tiny_model_dir, layout):
    trl = run(tmp_path, tiny_model_dir, "trl", layout, {}, False)
    mine = run(tmp_path, tiny_model_dir, "hub", layout, {}, True)
    assert mine["scoring_forwards"] == trl["scoring_forwards"] > 0
    torch.testing.assert_close(mine["weights"], trl["weights"], **CLOSE)


# --- 2 CPU ranks: DDP (gloo) and DeepSpeed ZeRO-3, every variant of a stage in one launch ---
TWO_RANK_VARIANTS = {  # variant: (grpo_hub settings, None: plain TRL; stand-in IS settings)
    "trl": (None, {"loss_time": False}),
    "loss_time": ({}, {"loss_time": True}),
    "trl_path_filter": (
        {"filter_zero_signal": True},
        {"loss_time": False, "mode": "token_truncate", "high": 1.03},
    ),
    "loss_time_filter": (
        {"filter_zero_signal": True},
        {"loss_time": True, "mode": "token_truncate", "high": 1.03},
    ),
}


@pytest.fixture(scope="module", params=["cpu-ddp.yaml", "cpu-zero3.yaml"], ids=["ddp", "zero3"])
def two_rank_is_runs(request):
    """{variant: [rank 0, rank 1]} of TWO_RANK_VARIANTS on the ALIGNED layout, 2 ranks, one launch per config."""
    from tests.conftest import requires
    from tests.training.distributed.equivalence_worker import run_grid

    if "zero3" in request.param:
        requires("deepspeed", "ZeRO-3 on 2 CPU ranks")
    settings = {name: hub for name, (hub, _) in TWO_RANK_VARIANTS.items()}
    stand_in = {name: is_settings for name, (_, is_settings) in TWO_RANK_VARIANTS.items()}
    runs = run_grid([ALIGNED], settings, config=request.param, vllm_is=stand_in)
    return request.param, {variant: ranks for (_, variant), ranks in runs.items()}


@pytest.mark.distributed
@pytest.mark.slow
def test_two_ranks_take_the_ratio_from_the_training_forward_like_trl(two_rank_is_runs):
    config, runs = two_rank_is_runs
    for ranks in runs.values():
        assert [r["world_size"] for r in ranks] == [2, 2] and ranks[0]["global_step"] >= 2
        if "zero3" in config:
            assert ranks[0]["distributed_type"] == "DistributedType.DEEPSPEED"
        assert ranks[0]["weights"].numel() > 10_000  # every weight, gathered under ZeRO-3
        torch.testing.assert_close(ranks[0]["weights"], ranks[1]["weights"], rtol=0, atol=0)  # ranks in sync
    for base, mine in (("trl", "loss_time"), ("trl_path_filter", "loss_time_filter")):
        assert all(r["scoring_forwards"] > 0 for r in runs[base])
        assert all(r["scoring_forwards"] == 0 for r in runs[mine])
        torch.testing.assert_close(runs[mine][0]["weights"], runs[base][0]["weights"], **CLOSE)
        theirs_logs, ours_logs = runs[base][0]["is_logs"], runs[mine][0]["is_logs"]
        assert len(ours_logs) == len(theirs_logs) >= 2
        for theirs, ours in zip(theirs_logs, ours_logs, strict=True):
            assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-5)
            if "filter" in mine:  # diagnostics cover the rows trained (ROWS_DROPPED)
                continue
            for key, value in theirs.items():
                if key != "loss":
                    assert ours[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
