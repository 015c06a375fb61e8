"""The one error every grpo_hub setting check raises: it names the field and the fix (the bottom floor)."""


def field_message(field_name: str, problem: str, fix: str) -> str:
    """ "`field`: problem Fix: fix", the one form of every message about a setting."""
    return f"`{field_name}`: {problem} Fix: {fix}"


def field_error(field_name: str, problem: str, fix: str) -> None:
    """Raise the ValueError of GRPOHubConfig and its checks (`field_message`)."""
    raise ValueError(field_message(field_name, problem, fix))
