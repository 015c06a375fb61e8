"""TRL-facing layer: `GRPOHubConfig`, `GRPOHubTrainer` (the only module that knows TRL's seams) and the
helpers it wires in: reference adapter, dynamic sampling, turns, vLLM checks/runtime, distributed helpers."""

from grpo_hub.training.console import quiet_tested_vllm

quiet_tested_vllm()  # before TRL's vLLM modules load: TRL warns then that vLLM 0.32 is outside its tested range
