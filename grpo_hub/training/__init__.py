"""The training step: `GRPOHubTrainer` (the only module that knows TRL's seams) and what it calls per batch: the
scored batch's edits, zero-signal filtering and packing, the own loss path, dynamic sampling, selective rollout,
multi-turn credit, the reference adapter, input checks, the finite-gradient guard, distributed helpers."""

from grpo_hub.records.console import quiet_tested_vllm

quiet_tested_vllm()  # before TRL's vLLM modules load: TRL warns then that vLLM 0.32 is outside its tested range
