"""Reading the text out of the input shapes Hermes accepts (strings, content parts, arrays)."""

from __future__ import annotations

from typing import Any

_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def content_text(content: Any) -> str:
    """Flatten a message content (string or list of parts) to text, parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for item in content:
            if isinstance(item, str) and item:
                parts.append(item)
            elif isinstance(item, dict) and str(item.get("type", "")).lower() in _TEXT_PARTS:
                text = item.get("text")
                if text:
                    parts.append(str(text))
        return "\n".join(parts)
    return str(content)


def last_input_text(value: str | list[Any]) -> str:
    """The turn's user text: the string itself, or the last element of an input array."""
    if isinstance(value, str):
        return value
    if not value:
        return ""
    last = value[-1]
    if isinstance(last, dict):
        return content_text(last.get("content"))
    return content_text(last)
