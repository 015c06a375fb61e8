"""The one error every grpo_hub setting check raises: it names the field and the fix (the bottom floor)."""


def field_error(field_name: str, problem: str, fix: str) -> None:
    """Raise the ValueError of GRPOHubConfig and its checks: "`field`: problem Fix: fix"."""
    raise ValueError(f"`{field_name}`: {problem} Fix: {fix}")
