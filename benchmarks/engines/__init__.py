"""Generation engines: TRL's merged weight sync against grpo_hub's adapter and server syncs (vLLM)."""
