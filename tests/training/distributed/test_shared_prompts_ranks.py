"""shared_prompts on 2 CPU ranks: DDP (cpu-ddp.yaml: torchrun + gloo) and DeepSpeed ZeRO-2 / ZeRO-3
(cpu-zero2.yaml, cpu-zero3.yaml). The shared-prompt forward runs per micro-batch per rank, so every rank groups its
own rows (2 prompts x 4 completions per rank here); the runs must train the padded runs' weights, losses and grad norms
to fp32 rounding with fewer tokens computed, for full fine-tuning and LoRA, 3 SGD steps each (the padding-free
runs' checks: tests/training/distributed/checks.py). With a KL term (beta > 0) the reference log-probs take the
shared-prompt forward too: a separate reference model (full fine-tuning; under DeepSpeed, its own engine) or the
adapter switched off (LoRA). With 2 micro-batches per optimizer step, whole groups (shared_prompts_whole_groups) re-split
each rank's own buffer."""

import json

import pytest
from transformers import AutoTokenizer

from grpo_hub.tasks import build_tiny_model
from tests.conftest import requires
from tests.helpers import step_logs
from tests.training.distributed.checks import (
    assert_padding_free_matches,
    assert_two_rank_world,
    padding_free_runs,
)
from tests.training.distributed.launch import run_accelerate_runs

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

EOS = AutoTokenizer.from_pretrained(build_tiny_model()).eos_token_id
# large enough that a wrong reference log-prob moves the loss and the gradient past fp32 rounding
KL_BETA = 0.5
# 2 micro-batches of 8 rows per optimizer step (4 groups of 4 per rank): TRL's order, and whole groups (the default)
WHOLE_GROUPS = {"trl_order_ga": {"shared_prompts_whole_groups": False}, "whole_ga": {}}
LAUNCHES = {"cpu-ddp.yaml": "MULTI_CPU", "cpu-zero2.yaml": "DEEPSPEED", "cpu-zero3.yaml": "DEEPSPEED"}


@pytest.fixture(scope="module", params=list(LAUNCHES), ids=["ddp", "zero2", "zero3"])
def runs(request) -> dict:
    """{name: result}: padded and shared-prompt runs, full fine-tuning and LoRA, in one 2-rank launch."""
    if request.param != "cpu-ddp.yaml":
        requires("deepspeed", "ZeRO-2/3 on 2 CPU ranks")
    configs = padding_free_runs({}, EOS)
    configs = {"padded": configs["padded"], "shared": {**configs["padding_free"], "shared_prompts": True}}
    runs = {}
    for name, config in configs.items():
        for kl, settings in (("", config), ("_kl", {**config, "beta": KL_BETA})):
            base = ["--trainer", "hub", "--scenario", "task", "--max-steps", "3", "--learning-rate", "0.1",
                    "--hub-config", json.dumps(settings)]  # fmt: skip
            runs[f"{name}{kl}"], runs[f"{name}{kl}_lora"] = base, [*base, "--lora"]
    for name, config in {
        "padded_ga": configs["padded"],
        **{n: {**configs["shared"], **c} for n, c in WHOLE_GROUPS.items()},
    }.items():
        runs[name] = ["--trainer", "hub", "--scenario", "task", "--max-steps", "3", "--learning-rate", "0.1",
                      "--grad-accum", "2", "--hub-config", json.dumps(config)]  # fmt: skip
    results = run_accelerate_runs(request.param, "grpo_worker.py", runs)
    return {"kind": LAUNCHES[request.param], **results}


@pytest.mark.parametrize(
    "suffix", ["", "_lora", "_kl", "_kl_lora"], ids=["full", "lora", "kl-full", "kl-lora"]
)
def test_shared_prompts_match_the_padded_run_on_two_ranks(runs, suffix):
    assert_two_rank_world(runs[f"shared{suffix}"], runs["kind"])
    assert_padding_free_matches(runs[f"padded{suffix}"], runs[f"shared{suffix}"], steps=3)
    if "_kl" in suffix:  # the reference log-probs: TRL logs their KL to the policy at every step
        padded, shared = (
            [entry["kl"] for entry in step_logs(runs[f"{name}{suffix}"])] for name in ("padded", "shared")
        )
        assert abs(padded[0]) < 1e-6 < padded[-1], padded  # step 1 starts at the reference, then leaves it
        assert shared == pytest.approx(padded, rel=1e-4, abs=1e-7)


def test_whole_groups_match_the_padded_run_on_two_ranks(runs):
    """Each rank re-splits its own buffer: the padded run's weights, losses and grad norms, fewer tokens than TRL's
    order."""
    for name in WHOLE_GROUPS:
        assert_two_rank_world(runs[name], runs["kind"])
        assert_padding_free_matches(runs["padded_ga"], runs[name], steps=3)
    for trl_order, whole in zip(runs["trl_order_ga"]["ranks"], runs["whole_ga"]["ranks"], strict=True):
        assert whole["scored_tokens"] < trl_order["scored_tokens"]
