"""Spec constructors with the defaults every operation family shares.

Kept apart from the families so the rules read in one place: reads are low risk, never need
approval or an idempotency key and may be retried; unsafe operations always require an
idempotency key (their result is stored and replayed for the same Action id) and never
retry. Risk and approval per operation are in `docs/capabilities.md`.
"""

from __future__ import annotations

from typing import Any

from schemas.manifest import Risk
from worker.operations.base import OperationSpec

#: One request that answers at once (discovery, CRUD).
QUICK_MS = 30_000
#: A synchronous agent turn (chat, responses, session chat): the model and tools run inside.
TURN_MS = 300_000
#: Following an agent's event stream to its end.
STREAM_MS = 900_000


def read(
    name: str,
    method: str,
    route: str,
    input_type: type[Any],
    description: str,
    *,
    streaming: bool = False,
    timeout_ms: int = QUICK_MS,
) -> OperationSpec:
    return OperationSpec(
        name=name,
        method=method,
        route=route,
        read_only=True,
        risk=Risk.LOW,
        approval_required=False,
        idempotency_required=False,
        streaming=streaming,
        timeout_ms=timeout_ms,
        input_type=input_type,
        description=description,
    )


def unsafe(
    name: str,
    method: str,
    route: str,
    input_type: type[Any],
    description: str,
    *,
    risk: Risk,
    approval: bool,
    streaming: bool = False,
    timeout_ms: int = QUICK_MS,
) -> OperationSpec:
    return OperationSpec(
        name=name,
        method=method,
        route=route,
        read_only=False,
        risk=risk,
        approval_required=approval,
        idempotency_required=True,
        streaming=streaming,
        timeout_ms=timeout_ms,
        input_type=input_type,
        description=description,
    )
