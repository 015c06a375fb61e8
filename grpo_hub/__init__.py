"""grpo_hub: GRPO-family features for Hugging Face TRL.

The pure-math modules (`advantages`, `losses`, `importance`) import torch only. The TRL-facing classes
are loaded lazily so that `import grpo_hub.advantages` never imports trl or transformers.
"""

__version__ = "0.1.0"

_LAZY = {"GRPOHubConfig": "grpo_hub.config", "GRPOHubTrainer": "grpo_hub.trainer"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grpo_hub' has no attribute {name!r}")


__all__ = ["GRPOHubConfig", "GRPOHubTrainer", "__version__"]
