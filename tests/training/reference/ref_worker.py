"""Worker for the 2-rank reference-adapter tests: LoRA GRPO with a refreshed "ref" adapter, hashes per rank.

Run under `accelerate launch` by tests/training/reference/test_reference_distributed.py (DDP over gloo, or DeepSpeed
ZeRO-3). After every optimizer step each rank gathers both adapters (a collective under ZeRO-3) and records
a SHA-256 of the reference and of the trained adapter plus their largest difference; it also records the
bytes of its LOCAL reference storage (the ZeRO-3 shard, or the whole tensor under DDP), so the test can tell
identical ranks from ranks that merely gather the same inconsistent shards. Trains each run of
`--runs '{"name": [run arguments], ...}'` (those of `parse_args`) one after the other in this launch and writes
<name>/rank<k>.json per run.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import torch
from datasets import Dataset
from transformers import TrainerCallback

from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.tasks.tiny_model import build_tiny_model
from grpo_hub.training.distributed import unwrap_peft_model
from grpo_hub.training.reference import REF_ADAPTER, paired_parameters, reference_state_dict
from tests.training.distributed.worker_common import run_each, write_rank_result
from tests.training.reference.helpers import char_code_reward, grpo_args, lora_config

PROMPTS = ["write the letter a", "count to three", "repeat b b b", "say many times c"]


def sha256(tensors: dict[str, torch.Tensor]) -> str:
    """Digest of the tensors' bytes in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def trained_state_dict(model) -> dict[str, torch.Tensor]:
    """Gathered copies of the trained adapter, keyed like the reference (so the two can be compared)."""
    pairs = paired_parameters(model, "default")
    trained = [t for _, t, _ in pairs]
    if any(hasattr(t, "ds_id") for t in trained):
        import deepspeed

        with deepspeed.zero.GatheredParameters(trained):
            return {name: t.detach().clone() for name, t, _ in pairs}
    return {name: t.detach().clone() for name, t, _ in pairs}


def local_reference_bytes(model) -> dict[str, torch.Tensor]:
    """This rank's own storage of the reference: the ZeRO-3 partition (`ds_tensor`) or the full tensor."""
    return {
        name: getattr(r, "ds_tensor", r).detach().clone()
        for name, _, r in paired_parameters(model, "default")
    }


class HashProbe(TrainerCallback):
    """Per step: hashes of the gathered reference / trained adapter, their max difference, local-shard hash."""

    def __init__(self, perturb_rank1_ref: bool = False):
        self.steps = {}
        self.perturb_rank1_ref = perturb_rank1_ref

    @staticmethod
    def record(model) -> dict:
        """Hashes and max difference of the two adapters of `model` (collective under ZeRO-3)."""
        peft_model = unwrap_peft_model(model)
        ref = reference_state_dict(peft_model)
        trained = trained_state_dict(peft_model)
        return {
            "ref": sha256(ref),
            "trained": sha256(trained),
            "local_ref": sha256(local_reference_bytes(peft_model)),
            "max_ref_minus_trained": max((ref[n] - trained[n].cpu()).abs().max().item() for n in ref),
        }

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.perturb_rank1_ref and args.process_index == 1:  # DDP only: make rank 1's reference diverge
            with torch.no_grad():
                for _, _, ref in paired_parameters(unwrap_peft_model(model), "default"):
                    ref.add_(0.01)
        self.steps["begin"] = self.record(model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.steps[state.global_step] = self.record(model)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """One run's arguments."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--sync-steps", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument(
        "--perturb-rank1-ref", action="store_true", help="offset rank 1's ref before training"
    )
    parser.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: never)")
    parser.add_argument(
        "--output-dir", default=None, help="trainer output dir (default: in the run's result dir)"
    )
    parser.add_argument("--resume", default=None, help="checkpoint folder to resume from")
    parser.add_argument(
        "--bf16", action="store_true", help="bf16 mixed precision (TRL keeps LoRA in bf16 under ZeRO-3)"
    )
    return parser.parse_args(argv)


def train(args: argparse.Namespace, result_dir: Path) -> None:
    """One run: train, then write this rank's result to `result_dir`/rank<k>.json."""
    config = grpo_args(
        args.output_dir or str(result_dir / "trainer_output"),
        GRPOHubConfig,
        max_steps=args.max_steps,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        ref_adapter_sync_on="steps",
        ref_adapter_sync_steps=args.sync_steps,
        ref_adapter_mixup_alpha=args.alpha,
        bf16=args.bf16,
        # Loaded in bf16 as the recipe does on GPUs: TRL then keeps the LoRA factors bf16 under ZeRO-3.
        model_init_kwargs={"dtype": "bfloat16"} if args.bf16 else None,
    )
    probe = HashProbe(args.perturb_rank1_ref)
    trainer = GRPOHubTrainer(
        model=build_tiny_model(),
        reward_funcs=char_code_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 8}),
        peft_config=lora_config(),
        callbacks=[probe],
    )
    trainer.train(resume_from_checkpoint=args.resume)
    peft_model = unwrap_peft_model(trainer.model)
    write_rank_result(
        trainer,
        result_dir,
        ref_partitioned=any(
            hasattr(r, "ds_id") and not r.ds_persist for _, _, r in paired_parameters(peft_model, "default")
        ),
        ref_trainable=any(
            p.requires_grad for n, p in peft_model.named_parameters() if f".{REF_ADAPTER}." in n
        ),
        refreshed_at=trainer._reference_callback.refreshed_at,
        adapter_dtypes=sorted({str(p.dtype) for n, p in peft_model.named_parameters() if "lora_" in n}),
        steps=probe.steps,  # step N: recorded before the refresh of step N (the probe runs first)
        final=probe.record(trainer.model),  # after the last refresh
        kl={row["step"]: row["kl"] for row in trainer.state.log_history if "kl" in row},
    )


if __name__ == "__main__":
    run_each(train, parse_args, __doc__)
