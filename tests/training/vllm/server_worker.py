"""Worker run by /opt/vllm-env's python (or `accelerate launch` for 2 ranks): short GRPOHubTrainer runs of the shipped
chain model against a vLLM OpenAI server (`vllm_mode="server"`), one after the other. Writes
`<result-dir>/<name>/rank<k>.json` per run: the log history, the world size, and (main process) the server probe after
every sync: the server's log-probs of fixed sequences against the trainer's, the sync mode, bytes and count.

    python tests/training/vllm/server_worker.py --result-dir DIR --base-url http://127.0.0.1:PORT --sync-dir SYNC \
        --runs '{"merged": {"vllm_server_sync": "merged", "lora_r": 16}}'

A run's JSON holds GRPOHubConfig overrides, plus `lora_r` (train a LoRA adapter of this rank; absent: full model),
`resume_from` (a checkpoint folder under the result dir, e.g. 'async/out/checkpoint-2'), `restart_after` (a step: after it, stop the server
and start it again with `--server-command`, before the next generation) and `trl_path` (is_path_probe.py). Every run also
records the IS path line, its scoring forwards and IS metric values per step (is_path_probe.py).
"""

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from grpo_hub import GRPOHubTrainer
from grpo_hub.generation.server_process import healthy
from grpo_hub.tasks import get_reward_funcs, load_task_dataset
from grpo_hub.tasks.chain_model import chain_model_path
from tests.helpers import tiny_config
from tests.training.distributed.worker_common import count_scored_tokens, end_ranks, write_rank_result
from tests.training.vllm import is_path_probe
from tests.training.vllm.sync_probe import fixed_sequences, trainer_logps

BASE_CONFIG = {
    "use_vllm": True,
    "vllm_mode": "server",
    "per_device_train_batch_size": 32,  # 8 prompts: some signal in every step
    "num_generations": 4,
    "max_completion_length": 24,
    "learning_rate": 5e-2,  # large: a stale server would show within a step
    "max_steps": 3,
}


def server_logps(client, sequences) -> torch.Tensor:
    """[sequences, length - 1] log-probs the server gives each next token of `sequences` (as served now)."""
    out = client.get_sequence_logprobs(sequences, [1] * len(sequences), top_logprobs=1)
    return torch.tensor([[position[0] for position in row] for row in out["actual_logprobs"]])


def install_probe(trainer) -> dict:
    """After every sync, record the server-vs-trainer mean |Δ log p| on fixed sequences, the served log-probs, the
    sync's mode and bytes (main process: the only one with a client)."""
    generation = trainer.vllm_generation
    sync = generation.grpo_hub_sync
    sequences = fixed_sequences(trainer.model.config.vocab_size)
    record = {"mode": sync.mode, "abs_logp_diff": [], "served_logps": [], "bytes": [], "seconds": []}
    lora = [p for n, p in trainer.model.named_parameters() if "lora_" in n and ".default." in n]
    record["adapter_bytes"] = sum(p.numel() * p.element_size() for p in lora)
    record["weight_bytes"] = sum(
        p.numel() * p.element_size() for n, p in trainer.model.named_parameters() if "lora_" not in n
    )
    original = sync.sync

    def probed():
        original()
        record["bytes"].append(sync.bytes_last_sync)
        record["seconds"].append(sync.seconds_last_sync)
        if trainer.accelerator.is_main_process:
            served, trained = server_logps(sync.client, sequences), trainer_logps(trainer.model, sequences)
            record["abs_logp_diff"].append((served - trained).abs().mean().item())
            record["served_logps"].append(served.tolist())

    sync.sync = probed
    generation.sync_weights = probed
    record["restarts_seen"] = 0  # restarted servers the trainer noticed before generating
    forget = sync.forget_served

    def forgetting():
        record["restarts_seen"] += 1
        forget()

    sync.forget_served = forgetting
    score = trainer._calculate_rewards
    record["prompts"] = []  # the prompts of every scored training batch, in order

    def scoring(inputs, prompts, completions, completion_ids_list):
        if trainer.model.training:
            record["prompts"].append(sorted({json.dumps(prompt) for prompt in prompts}))
        return score(inputs, prompts, completions, completion_ids_list)

    trainer._calculate_rewards = scoring
    return record


class RestartServer(TrainerCallback):
    """After optimizer step `step`, sync the new policy (as TRL would before its next generation), then stop the
    server (its process group) and start `command` again: the restarted server holds its checkpoint while the trainer
    believes it synced. Waits until the server is up."""

    def __init__(self, trainer, step: int, command: dict, base_url: str):
        self.trainer, self.step, self.command, self.base_url = trainer, step, command, base_url

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != self.step:
            return
        self.trainer.vllm_generation.sync_weights()
        self.trainer._last_loaded_step = state.global_step
        if not state.is_world_process_zero:
            return
        os.killpg(self.command["pgid"], signal.SIGKILL)
        with open(self.command["log"], "a") as log:
            process = subprocess.Popen(
                self.command["argv"], env=self.command["env"], start_new_session=True,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.command["pgid"] = process.pid
        Path(self.command["pgid_file"]).write_text(str(process.pid))  # the test stops it
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if healthy(self.base_url):
                return
            time.sleep(1)
        raise RuntimeError("the restarted server did not come up")


def train(
    run_dir: Path, overrides: dict, server: dict, server_command: dict | None, result_root: Path
) -> None:
    """One run against `server` ({"vllm_server_base_url": ..., "vllm_server_sync_dir": ...})."""
    overrides = dict(overrides)
    lora_r = overrides.pop("lora_r", 0)
    resume_from = overrides.pop("resume_from", None)
    restart_after = overrides.pop("restart_after", None)
    trl_path = overrides.pop("trl_path", False)
    args = tiny_config(run_dir / "out", **{**BASE_CONFIG, **server, **overrides})
    peft_config = None
    if lora_r:
        from peft import LoraConfig

        peft_config = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules="all-linear")
    path_lines = []
    with is_path_probe.printed_path_lines(path_lines):
        trainer = GRPOHubTrainer(
            model=chain_model_path(),
            peft_config=peft_config,
            reward_funcs=get_reward_funcs("chain"),
            args=args,
            train_dataset=load_task_dataset("chain", n=64, seed=0),
        )
    forwards, per_step = is_path_probe.install(trainer, trl_path)
    scored_tokens = count_scored_tokens(trainer.model)
    record = install_probe(trainer)
    record["hinted_prompt_ids"] = note_hinted_prompt_ids(trainer) if trainer._hints is not None else None
    # the probe's forwards (after each sync) are no scoring forwards
    forwards.pause_during(trainer.vllm_generation, "sync_weights")
    forwards.pause_during(trainer.vllm_generation.grpo_hub_sync, "sync")
    if restart_after is not None:
        trainer.add_callback(
            RestartServer(trainer, restart_after, server_command, server["vllm_server_base_url"])
        )
    checkpoint = str(result_root / resume_from) if resume_from is not None else None
    trainer.train(resume_from_checkpoint=checkpoint)
    write_rank_result(
        trainer,
        run_dir,
        probe=record,
        syncs=trainer.vllm_generation.grpo_hub_sync.syncs,
        scored_tokens=scored_tokens[0],
        packed_forwards=scored_tokens[1],
        **is_path_probe.fields(path_lines, forwards, per_step),
    )


def note_hinted_prompt_ids(trainer) -> list[int]:
    """Every prompt-id list the trainer sends for generation (TRL's `_generate` and asynchronous rollouts both take
    them from `_tokenize_prompts`) that holds a hint: the count per call whose ids end with the hint's tokens."""
    tokenize, counts = trainer._tokenize_prompts, []

    def noted(prompts):
        ids, *rest = tokenize(prompts)
        hinted = [
            (row, trainer._hints.encode(p[-1]["content"]))
            for row, p in zip(ids, prompts, strict=True)
            if p[-1].get("grpo_hub_hint")
        ]
        counts.append(sum(list(row[-len(end) :]) == end for row, end in hinted))
        return (ids, *rest)

    trainer._tokenize_prompts = noted
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--result-dir", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--sync-dir", required=True, help="the server's sync folder (vllm_server_sync_dir)")
    parser.add_argument("--runs", required=True, help="JSON: {run name: overrides}")
    parser.add_argument("--server-command", default=None, help="JSON: {argv, env, log, pgid, pgid_file}")
    cli = parser.parse_args()
    command = json.loads(cli.server_command) if cli.server_command else None
    for name, overrides in json.loads(cli.runs).items():
        server = {"vllm_server_base_url": cli.base_url, "vllm_server_sync_dir": cli.sync_dir}
        train(Path(cli.result_dir, name), overrides, server, command, Path(cli.result_dir))


if __name__ == "__main__":
    main()
    end_ranks()
