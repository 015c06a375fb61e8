"""The one error of config validation: it names the field, what is wrong, and the fix."""


def field_error(field_name: str, problem: str, fix: str) -> None:
    """Raise the ValueError of GRPOHubConfig and its checks: "`field`: problem Fix: fix"."""
    raise ValueError(f"`{field_name}`: {problem} Fix: {fix}")
