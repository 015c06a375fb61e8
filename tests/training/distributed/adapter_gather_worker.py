"""Worker for the ZeRO-3 test of `vllm_adapter_sync`'s gather (no vLLM): after the first optimizer step each rank
gathers the trained adapter the way the sync does (`adapter_sync.gathered_adapter` with TRL's
`DistributedBackend.gather_params`) and records whether the adapter was partitioned before, the gathered shapes
against DeepSpeed's full shapes, whether every other parameter stayed partitioned, and a SHA-256 of the copies next
to one of the same tensors gathered with every parameter (TRL's merged path gathers them all).

    accelerate launch --config_file <zero3 config> adapter_gather_worker.py --result-dir DIR
"""

from __future__ import annotations

import argparse

import deepspeed
from transformers import TrainerCallback
from trl.distributed import DistributedBackend

from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.generation.adapter_sync import adapter_parameters, gathered_adapter
from grpo_hub.tasks.tiny_model import build_tiny_model
from grpo_hub.training.distributed import unwrap_peft_model
from tests.training.distributed.worker_common import end_ranks, write_rank_result
from tests.training.reference.helpers import char_code_reward, grpo_args, lora_config, prompt_dataset
from tests.training.reference.ref_worker import sha256


def partitioned(param) -> bool:
    """A ZeRO-3 parameter whose full tensor is not on this rank now."""
    return param.ds_status == deepspeed.runtime.zero.partition_parameters.ZeroParamStatus.NOT_AVAILABLE


class GatherProbe(TrainerCallback):
    def __init__(self, accelerator):
        self.backend, self.record = DistributedBackend(accelerator), None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.record is not None:
            return
        peft_model = unwrap_peft_model(model)
        adapter = adapter_parameters(peft_model.named_parameters(), "default")
        others = [p for p in peft_model.parameters() if all(p is not a for a in adapter.values())]
        before = all(partitioned(p) for p in adapter.values())
        copies = gathered_adapter(peft_model, "default", self.backend.gather_params)
        with deepspeed.zero.GatheredParameters(
            list(peft_model.parameters())
        ):  # every parameter, as TRL's merge
            everything = {name: param.detach().clone() for name, param in adapter.items()}
        self.record = {
            "adapter_partitioned_before": before,
            "shapes_full": all(tuple(copies[n].shape) == tuple(p.ds_shape) for n, p in adapter.items()),
            "adapter_tensors": len(copies),
            "others_partitioned_after": all(partitioned(p) for p in others),
            "copies_sha": sha256(copies),
            "all_gathered_sha": sha256(everything),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--result-dir", required=True)
    cli = parser.parse_args()
    args = grpo_args(f"{cli.result_dir}/out", GRPOHubConfig, max_steps=1, learning_rate=5e-2)
    trainer = GRPOHubTrainer(
        model=build_tiny_model(),
        reward_funcs=char_code_reward,
        args=args,
        train_dataset=prompt_dataset(),
        peft_config=lora_config(),
    )
    probe = GatherProbe(trainer.accelerator)
    trainer.add_callback(probe)
    trainer.train()
    write_rank_result(trainer, cli.result_dir, gather=probe.record)


if __name__ == "__main__":
    main()
    end_ranks()
