"""Moved: GRPOHubConfig lives in `grpo_hub.config.hub_config` (import it as `from grpo_hub import GRPOHubConfig`).
This alias warns and goes away in the next release."""

import warnings

from grpo_hub.config.hub_config import GRPOHubConfig

__all__ = ["GRPOHubConfig"]
warnings.warn(
    "grpo_hub.training.config moved to grpo_hub.config.hub_config; import GRPOHubConfig from grpo_hub.",
    DeprecationWarning,
    stacklevel=2,
)
