"""grpo_hub: GRPO-family features for Hugging Face TRL.

Wings, bottom floor first (a module imports only from its own wing or lower ones; tests/test_layers.py):
  algos     pure formulas, torch only: advantages, losses, importance, filtering
  training  GRPOHubConfig, GRPOHubTrainer (TRL's seams), reference adapter, dynamic sampling, turns, vLLM
  hub       push / pull of trained adapters, model cards (public API: grpo_hub.hub)
  tasks     built-in tasks and their offline tiny models, tool task, gym GRPO
  compare   base vs adapters: model bank, scoring, the Gradio Space
  cli       the `grpo-hub` command
The TRL-facing classes are loaded lazily so that `import grpo_hub.algos.advantages` never imports trl.
"""

__version__ = "0.1.0"

_LAZY = {"GRPOHubConfig": "grpo_hub.config.hub_config", "GRPOHubTrainer": "grpo_hub.training.trainer"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grpo_hub' has no attribute {name!r}")


__all__ = ["GRPOHubConfig", "GRPOHubTrainer", "__version__"]
