"""Timestamps for people: ISO 8601 in UTC, millisecond precision (`2026-12-02T02:04:35.123Z`).

The wire keeps Unix milliseconds (`*_unix_ms`); `audit`, `escalations list/show` and
`tail --format text` show this form instead, and their `--json` prints the raw documents.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

_SUFFIX = "_unix_ms"


def iso_utc(unix_ms: int) -> str:
    """`unix_ms` as ISO 8601 UTC with milliseconds and a `Z`."""
    moment = datetime.fromtimestamp(unix_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def with_iso(value: Any) -> Any:
    """`value` (JSON-shaped) with an `…_utc` ISO companion beside every integer
    `…_unix_ms` field, at any depth (`raised_at_unix_ms` → `raised_at_utc`); nothing is
    removed, so a reader of the raw fields still finds them."""
    if isinstance(value, list):
        return [with_iso(item) for item in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        out[key] = with_iso(item)
        if isinstance(key, str) and key.endswith(_SUFFIX) and type(item) is int:
            out[key.removesuffix(_SUFFIX) + "_utc"] = iso_utc(item)
    return out
