"""Accuracy over time beside plain TRL: time to accuracy on each clock, its harness and meters, pass@k."""
