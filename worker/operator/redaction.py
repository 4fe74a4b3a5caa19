"""What of a provider event or run may be retained in Redis, chunks and results.

The operator's data is confidential and may contain PII (spec "Operation contract":
redaction required). Each event keeps an allowlist of fields; free text that echoes a
command (approval prompts, tool previews) is replaced by its length and a short digest, which
is enough to correlate a prompt without retaining what it would run. Unknown fields are
dropped rather than passed through, so a new provider field is never leaked by default.
"""

from __future__ import annotations

import hashlib
from typing import Any

MAX_ERROR_TEXT = 512

#: Fields retained verbatim per event (the model output itself is the Action's product).
_KEEP: dict[str, tuple[str, ...]] = {
    "message.delta": ("delta",),
    "reasoning.available": ("text",),
    "tool.started": ("tool",),
    "tool.completed": ("tool", "duration", "error"),
    "approval.request": (
        "description",
        "pattern_key",
        "pattern_keys",
        "allow_permanent",
        "choices",
        # After 0.19: the prompt's id, sent back with the decision (worker/operator/resume.py).
        "request_id",
    ),
    "approval.responded": ("choice", "resolved"),
    "run.completed": ("output", "usage"),
    "run.cancelled": (),
}
#: Fields that echo commands: kept only as a digest.
_DIGEST: dict[str, tuple[str, ...]] = {
    "tool.started": ("preview",),
    "approval.request": ("command",),
}
_ALWAYS = ("event", "run_id", "timestamp")


def digest(text: str) -> dict[str, Any]:
    """A stand-in for retained text: its length and the first 16 hex of its sha256."""
    return {
        "redacted": True,
        "length": len(text),
        "sha256_16": hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16],
    }


def bounded_text(value: Any, limit: int = MAX_ERROR_TEXT) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "…"


def redact_event(event: dict[str, Any]) -> dict[str, Any]:
    """The retainable view of one provider event."""
    name = event.get("event")
    kept: dict[str, Any] = {k: event[k] for k in _ALWAYS if k in event}
    if not isinstance(name, str):
        return kept
    for key in _KEEP.get(name, ()):
        if key in event:
            kept[key] = event[key]
    for key in _DIGEST.get(name, ()):
        value = event.get(key)
        if isinstance(value, str):
            kept[key] = digest(value)
    if name == "run.failed":
        kept["error"] = bounded_text(event.get("error"))
    return kept


def redact_output(output: dict[str, Any] | None) -> dict[str, Any] | None:
    """Provider evidence for operators' eyes (`binding show`): output text as a digest."""
    if output is None:
        return None
    shown = dict(output)
    text = shown.get("output")
    if isinstance(text, str):
        shown["output"] = digest(text)
    return shown
