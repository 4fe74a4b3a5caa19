"""The text a Hermes session receives for a result or an escalation: normalized and bounded.

Status, capability, Action id, then a bounded summary of the output or the error. Keys
that name credentials are dropped at any depth before the summary is cut, the worker's
error message is the only error text, and the whole message never exceeds the rule's
`max_message_bytes` (cut on a character boundary, marked `…[truncated]`).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from schemas.escalation import Escalation
from schemas.result import ActionResult

_SECRET_KEY = re.compile(
    r"(api[_-]?key|secret|token|password|passwd|authorization|credential|seed|cookie)",
    re.IGNORECASE,
)
_TRUNCATED = "…[truncated]"
_MAX_DEPTH = 32


def _scrub(value: Any, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        return "…"
    if isinstance(value, dict):
        return {
            str(k): "[redacted]" if _SECRET_KEY.search(str(k)) else _scrub(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_scrub(v, depth + 1) for v in value]
    return value


def _bounded(text: str, max_bytes: int) -> str:
    encoded = text.encode()
    if len(encoded) <= max_bytes:
        return text
    keep = max_bytes - len(_TRUNCATED.encode())
    return encoded[:keep].decode("utf-8", errors="ignore") + _TRUNCATED


def result_message(result: ActionResult, max_bytes: int) -> str:
    lines = [
        f"[AIP result] {result.status.value}",
        f"action: {result.action_id}",
        f"capability: {result.capability}",
    ]
    if result.error is not None:
        error = result.error
        lines.append(
            f"error: {error.code.value} (retryable={str(error.retryable).lower()}, "
            f"uncertain_outcome={str(error.uncertain_outcome).lower()}): {error.message}"
        )
    if result.output is not None:
        summary = msgspec.json.encode(_scrub(result.output)).decode()
        lines.append(f"output: {summary}")
    return _bounded("\n".join(lines), max_bytes)


def escalation_message(escalation: Escalation, max_bytes: int) -> str:
    what = escalation.code.value if escalation.code else escalation.status.value
    lines = [
        f"[AIP escalation] {escalation.kind.value}: {what}",
        f"escalation: {escalation.escalation_id}",
        f"action: {escalation.action_id}",
        f"capability: {escalation.capability}",
        f"decision: {escalation.decision}",
    ]
    if escalation.approval is not None:
        choices = ", ".join(c.value for c in escalation.approval.choices)
        lines.append(f"choices: {choices}")
        prompt = msgspec.json.encode(_scrub(escalation.approval.prompt)).decode()
        lines.append(f"prompt (redacted): {prompt}")
    if escalation.deadline_unix_ms is not None:
        lines.append(f"deadline_unix_ms: {escalation.deadline_unix_ms}")
    lines.extend(f"evidence: {command}" for command in escalation.evidence)
    return _bounded("\n".join(lines), max_bytes)
