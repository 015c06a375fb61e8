"""What a step costs beside plain TRL: step time, forwards, the scoring pass, memory, rollout budgets."""
