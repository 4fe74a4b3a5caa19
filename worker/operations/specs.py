"""Every operation's spec facts, read from the capability catalog (worker/operations/catalog.py).

The catalog row of an operation is the one source of what the manifest declares and what the
runtime enforces: its route, whether it is read-only (the reference connector's `low`-risk
set), its risk, whether it needs approval and an idempotency key, whether it streams and its
time budget (the row's SLA timeout). A family module only adds what the catalog cannot know:
the input type and the description. So the published contract and the admission rules cannot
drift apart (docs/capabilities.md has the table and the project's documented departures).
"""

from __future__ import annotations

from typing import Any

from schemas.manifest import Risk
from worker.operations.base import OperationSpec
from worker.operations.catalog import BY_NAME, STREAM_ONLY


def spec(name: str, input_type: type[Any], description: str) -> OperationSpec:
    """The spec of catalog operation `name`; KeyError for a name the catalog does not hold."""
    row = BY_NAME[name]
    return OperationSpec(
        name=name,
        method=row.method,
        route=row.path,
        read_only=row.read_only,
        risk=Risk(row.risk),
        approval_required=row.approval,
        idempotency_required=row.idempotency_required,
        streaming=row.completion == "streaming",
        timeout_ms=row.sla_timeout_ms,
        input_type=input_type,
        description=description,
        stream_only=name in STREAM_ONLY,
    )
