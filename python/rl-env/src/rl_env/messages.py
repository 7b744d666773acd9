"""Helpers for OpenAI-style chat messages (dicts with `role`, `content`, optional `tool_calls`)."""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]
"""One OpenAI-style chat message."""

Messages = list[Message]
"""A conversation."""

ROLES = ("system", "user", "assistant", "tool")


def last_reply(messages: Messages | None) -> str:
    """Content of the last assistant message ("" if none)."""
    for m in reversed(messages or []):
        if m.get("role") == "assistant":
            return str(m.get("content") or "")
    return ""


def parse_tag(text: str, tag: str) -> str | None:
    """The stripped text inside the first `<tag>...</tag>`, or None."""
    start = text.find(f"<{tag}>")
    if start < 0:
        return None
    start += len(tag) + 2
    end = text.find(f"</{tag}>", start)
    if end < 0:
        return None
    return text[start:end].strip()


def check_messages(messages: Any, what: str) -> Messages:
    """Validates a list of message dicts; raises ValueError naming `what` and the index."""
    if not isinstance(messages, list):
        raise ValueError(f"{what} must be a list of messages, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"{what}[{i}] must be a dict, got {type(m).__name__}")
        if m.get("role") not in ROLES:
            raise ValueError(f"{what}[{i}].role must be one of {', '.join(ROLES)}, got {m.get('role')!r}")
        if not isinstance(m.get("content", ""), str):
            raise ValueError(f"{what}[{i}].content must be a string")
        if m["role"] == "tool" and not m.get("tool_call_id"):
            raise ValueError(f"{what}[{i}] is a tool message without `tool_call_id`")
    return messages
