"""Side-by-side benchmarks of grpo_hub against plain TRL; `python -m benchmarks` runs them all."""
