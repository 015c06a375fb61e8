"""Worker run by /opt/vllm-env's python (or `accelerate launch` for 2 ranks): short GRPOHubTrainer runs with vLLM
in colocate mode on CPU, one after the other in this one process (the imports and the first engine start are
most of a run's time; each later run builds its own trainer and engine). Writes `<result-dir>/<name>/rank<k>.json`
per run with the log history, the world size, the engine dtype and a checksum of the trained weights.

    python tests/training/vllm/colocate_worker.py --result-dir DIR \
        --runs '{"agilerl": {"vllm_is_preset": "agilerl"}, "lora": {"lora_r": 16}}'

A run's JSON holds GRPOHubConfig overrides, plus `lora_r`: train a LoRA adapter of this rank (absent: full model),
`probe`: record the engine against the trainer after every weight sync (sync_probe.py; "compare_merged": the
same weights merged, too), and `trl_path` (is_path_probe.py). Every run also records the IS path line, its scoring
forwards and IS metric values per step (is_path_probe.py), the tokens of its scoring forwards (and how many got packed
rows), and saves its trainable weights to `<name>/weights<k>.pt`.
The vLLM environment's python imports `tests....` through PYTHONPATH (engine.vllm_env: the repository root).
"""

import argparse
import gc
import json
from pathlib import Path

import torch

from grpo_hub import GRPOHubTrainer
from grpo_hub.tasks import SMOKE_TASK, build_tiny_model, get_reward_funcs, load_task_dataset
from tests.helpers import tiny_config
from tests.training.distributed.worker_common import (
    count_scored_tokens,
    end_ranks,
    weight_fingerprint,
    write_rank_result,
)
from tests.training.vllm import is_path_probe
from tests.training.vllm.sync_probe import install_probe

# tests.helpers.tiny_config (CPU, 4 generations of 8 tokens, learning rate 1e-2, seed 0) with vLLM colocate
BASE_CONFIG = {
    "use_vllm": True,
    "vllm_mode": "colocate",
    "vllm_max_model_length": 128,
    "per_device_train_batch_size": 4,
    "max_steps": 2,
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--result-dir", required=True)
    parser.add_argument("--runs", required=True, help="JSON: {run name: GRPOHubConfig overrides (+ lora_r)}")
    return parser.parse_args()


def lora_config(rank: int):
    """The LoRA adapter a run with `lora_r` trains (rounding_probe.py serves one)."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear")


def train(model_dir: str, run_dir: Path, overrides: dict) -> None:
    """One run with `overrides`: train in `run_dir`/out, write this rank's result to `run_dir`/rank<k>.json."""
    overrides = dict(overrides)
    lora_r = overrides.pop("lora_r", 0)
    probe = overrides.pop("probe", False)
    trl_path = overrides.pop("trl_path", False)
    dataset = load_task_dataset(SMOKE_TASK, n=32, seed=0)
    if overrides.pop("varied_prompts", False):  # 0-3 words before each prompt: TRL left-pads the shorter ones
        dataset = dataset.map(
            lambda row, i: {"prompt": "please " * (i % 4) + row["prompt"]}, with_indices=True
        )
    args = tiny_config(run_dir / "out", **{**BASE_CONFIG, **overrides})
    peft_config = lora_config(lora_r) if lora_r else None
    path_lines = []
    with is_path_probe.printed_path_lines(path_lines):
        trainer = GRPOHubTrainer(
            model=model_dir,
            peft_config=peft_config,
            reward_funcs=get_reward_funcs(SMOKE_TASK),
            args=args,
            train_dataset=load_task_dataset(SMOKE_TASK, n=32, seed=0),
        )
    forwards, per_step = is_path_probe.install(trainer, trl_path)
    scored_tokens = count_scored_tokens(trainer.model)
    record = install_probe(trainer, compare_merged=probe == "compare_merged") if probe else None
    if probe:  # the probe's own no-grad forwards are no scoring forwards
        forwards.pause_during(trainer.vllm_generation, "sync_weights")
    trainer.train()
    trained = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    weights_file = run_dir / f"weights{trainer.accelerator.process_index}.pt"
    torch.save(trained, weights_file)
    write_rank_result(
        trainer,
        run_dir,
        engine_dtype=str(trainer.vllm_generation.llm.llm_engine.model_config.dtype),
        weight_checksum=weight_fingerprint(trainer.model.parameters()),
        threads=torch.get_num_threads(),
        probe=record,
        weights_file=str(weights_file),
        scored_tokens=scored_tokens[0],
        packed_forwards=scored_tokens[1],
        **is_path_probe.fields(path_lines, forwards, per_step),
    )


def main():
    cli = parse_args()
    model_dir = build_tiny_model()
    for name, overrides in json.loads(cli.runs).items():
        train(model_dir, Path(cli.result_dir, name), overrides)
        gc.collect()  # the finished run's engine and its KV cache


if __name__ == "__main__":
    main()
    end_ranks()
