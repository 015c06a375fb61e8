"""TRL-facing layer: `GRPOHubConfig`, `GRPOHubTrainer` (the only module that knows TRL's seams) and the
helpers it wires in: reference adapter, dynamic sampling, turns, vLLM checks/runtime, distributed helpers."""
