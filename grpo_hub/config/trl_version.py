"""The TRL versions grpo_hub is tested with, checked when GRPOHubConfig is imported."""

import trl
from packaging.version import Version

TRL_RANGE = (Version("1.16"), Version("1.17"))
SUPPORTED_TRL = f"trl>={TRL_RANGE[0]},<{TRL_RANGE[1]}"


def check_trl_version() -> None:
    """Raise ImportError when the installed TRL is outside the tested range."""
    low, high = TRL_RANGE
    installed = Version(trl.__version__)
    if not low <= installed < high:
        raise ImportError(
            f"grpo_hub supports trl>={low},<{high} but trl {trl.__version__} is installed. "
            f'Install a supported version: pip install "trl>={low},<{high}".'
        )
