"""Text of a TRL completion, shared by the reward functions of the built-in tasks."""

from __future__ import annotations


def completion_text(completion) -> str:
    """Plain text of a TRL completion: a string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(message.get("content") or "" for message in completion)
