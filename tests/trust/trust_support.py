"""Builders shared by the trust tests: Actions as bytes, endpoints, operation specs."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from schemas.action import Action
from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.ids import new_action_id
from schemas.manifest import Risk
from worker.endpoints import Endpoint, EndpointDescriptor
from worker.operations.base import OperationSpec
from worker.testing.identities import (
    ISSUER,
    PRINCIPAL_KIND,
    REVISION,
    TENANT_A,
    USER_A,
    TrustFiles,
)
from worker.wire.actions import GATEWAY_SENDER, decode_action
from worker.wire.actions import encode_action as encode_wire_action


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def action_document(
    *,
    endpoint: str = "hermes-a",
    operation: str = "operator",
    principal: str = USER_A,
    tenant: str | None = TENANT_A,
    revision: int | None = REVISION,
    input: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An Action as the JSON object a publisher sends; `extra` adds or replaces fields."""
    identity: dict[str, Any] = {
        "principal_id": principal,
        "principal_kind": PRINCIPAL_KIND,
        "authentication_issuer": ISSUER,
    }
    if tenant is not None:
        identity["tenant_id"] = tenant
    if revision is not None:
        identity["credential_revision"] = revision
    document: dict[str, Any] = {
        "id": new_action_id(),
        "capability": f"cap:hermes_agent:{endpoint}:{operation}",
        "input": {"objective": "summarise the inbox"} if input is None else input,
        "identity": identity,
        "created_at_unix_ms": now_ms(),
        "idempotency_key": "idem-1",
        "trace": {"trace_id": "trace-1", "correlation_id": "corr-1"},
    }
    document.update(extra)
    return document


def encode_action(
    document: dict[str, Any], files: TrustFiles | None = None
) -> tuple[Action, bytes]:
    """The AIP Action Envelope of `document` (signed by the gateway key of `files`, else
    unsigned) and the Action decoded from it, as the runtime sees both. EnvelopeRejected
    when `document` is not an Action the workers accept."""
    try:
        action = msgspec.convert(document, Action, strict=True)
    except msgspec.ValidationError as exc:
        raise EnvelopeRejected(ErrorCode.SCHEMA_ENVELOPE_INVALID, str(exc)) from None
    payload = files.seal_action(action) if files else seal_unsigned(action)
    return decode_action(payload)[0], payload


def seal_unsigned(action: Action) -> bytes:
    return encode_wire_action(action, signer=None, sender=GATEWAY_SENDER)


def endpoint(
    endpoint_id: str = "hermes-a",
    *,
    tenant: str | None = None,
    tenant_expires_at_unix_ms: int | None = None,
    shared: bool | None = None,
) -> Endpoint:
    """A descriptor for gate tests; bound to no tenant it is shared unless `shared=False`
    (an unshared unbound endpoint refuses every Action that carries a tenant)."""
    descriptor = EndpointDescriptor(
        id=endpoint_id,
        url="http://127.0.0.1:9",
        tenant_id=tenant,
        tenant_expires_at_unix_ms=tenant_expires_at_unix_ms,
        shared=tenant is None if shared is None else shared,
    )
    return Endpoint(descriptor=descriptor, api_key=None)


def spec(*, approval_required: bool) -> OperationSpec:
    return OperationSpec(
        name="operator" if approval_required else "models",
        method="POST" if approval_required else "GET",
        route="/v1/runs" if approval_required else "/v1/models",
        read_only=not approval_required,
        risk=Risk.HIGH if approval_required else Risk.LOW,
        approval_required=approval_required,
        idempotency_required=approval_required,
        streaming=approval_required,
        timeout_ms=900_000,
        input_type=dict,
    )


GOVERNED = spec(approval_required=True)
UNGOVERNED = spec(approval_required=False)
