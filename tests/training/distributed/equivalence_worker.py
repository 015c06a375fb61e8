"""2-rank worker of the equivalence suite (tests/training/test_equivalence.py): trains layouts of
tests/training/equivalence_runs.py with plain TRL or grpo_hub, one run after the other in one launch.

Each run writes <result-dir>/<run>/rank<k>.json (world, logged rewards, filtering's dropped share) and
rank<k>.pt (the trainable weights, flat float64). `run_grid` launches it (accelerate cpu-ddp.yaml: torchrun +
gloo, 2 CPU ranks) and reads the results back.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from tests.training.distributed.worker_common import rank_result, run_each
from tests.training.equivalence_runs import Layout, logged_rewards, train, trained_weights

CONFIG = "cpu-ddp.yaml"
SEPARATOR = "~"  # run name = layout name + SEPARATOR + variant


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layout", required=True, help="JSON of equivalence_runs.Layout fields")
    parser.add_argument("--settings", default=None, help="JSON of GRPOHubConfig fields; absent: plain TRL")
    parser.add_argument(
        "--vllm-is", default=None, help="JSON of the stand-in vLLM sampler's settings (vllm_stand_in)"
    )
    return parser.parse_args(argv)


def train_run(args: argparse.Namespace, result_dir: Path) -> None:
    from grpo_hub.tasks import build_tiny_model

    layout = Layout(**json.loads(args.layout))
    kind = "trl" if args.settings is None else "hub"
    settings = {} if args.settings is None else json.loads(args.settings)
    vllm_is = None if args.vllm_is is None else json.loads(args.vllm_is)
    trainer = train(
        kind, layout, settings, result_dir / "out", build_tiny_model(), num_processes=2, vllm_is=vllm_is
    )
    rank = trainer.accelerator.process_index
    result_dir.mkdir(parents=True, exist_ok=True)
    torch.save(trained_weights(trainer), result_dir / f"rank{rank}.pt")
    dropped = [e["zero_signal/frac_rows_dropped"] for e in trainer.state.log_history if "reward" in e and
               "zero_signal/frac_rows_dropped" in e]  # fmt: skip
    result = rank_result(trainer, rewards=logged_rewards(trainer), frac_rows_dropped=dropped)
    if vllm_is is not None:  # the stand-in's count, and the logged loss and IS metrics of every step
        result["scoring_forwards"] = trainer.scoring_forwards.count
        keys = ("loss", "sampling/", "vllm_is/")
        result["is_logs"] = [
            {k: v for k, v in e.items() if k.startswith(keys)} for e in result["log_history"] if "loss" in e
        ]
    result.pop("log_history")
    (result_dir / f"rank{rank}.json").write_text(json.dumps(result))
    trainer.accelerator.wait_for_everyone()


def run_grid(
    layouts: list[Layout],
    variants: dict[str, dict | None],
    config: str = CONFIG,
    vllm_is: dict[str, dict] | None = None,
) -> dict:
    """Train every layout with every variant (settings; None: plain TRL) on 2 ranks in one launch of the accelerate
    `config`; `vllm_is[variant]`: that variant runs TRL's vLLM IS path through the stand-in sampler with these settings.

    Returns {(layout name, variant): [rank 0, rank 1]}, each the rank's JSON plus its "weights" tensor."""
    from tests.training.distributed.launch import run_accelerate_runs

    runs = {}
    for layout in layouts:
        for variant, settings in variants.items():
            argv = ["--layout", json.dumps(layout.__dict__)]
            argv += [] if settings is None else ["--settings", json.dumps(settings)]
            if vllm_is and variant in vllm_is:
                argv += ["--vllm-is", json.dumps(vllm_is[variant])]
            runs[f"{layout.name}{SEPARATOR}{variant}"] = argv
    results = run_accelerate_runs(config, Path(__file__).name, runs, keep=_with_weights)
    return {tuple(name.split(SEPARATOR)): result["ranks"] for name, result in results.items()}


def _with_weights(run_dir: Path, ranks: list[dict]) -> None:
    for rank in ranks:
        rank["weights"] = torch.load(run_dir / f"rank{rank['rank']}.pt")


if __name__ == "__main__":
    run_each(train_run, parse_args, __doc__)
