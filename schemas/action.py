"""The Action envelope a publisher puts on `aip.hermes.{endpoint}.actions`."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec

from schemas._base import WireStruct
from schemas.aip.approval import ApprovalDecision
from schemas.ids import ActionId, CapabilityId, ShortText, UnixMs


class Mode(StrEnum):
    SYNC = "sync"
    ASYNC = "async"
    STREAM = "stream"


class Identity(WireStruct, kw_only=True, frozen=True):
    """Who the Action is for, as the gateway verified it; checked against the directory."""

    principal_id: ShortText
    principal_kind: ShortText
    tenant_id: ShortText | None = None
    authentication_issuer: ShortText | None = None
    credential_revision: Annotated[int, msgspec.Meta(ge=0)] | None = None


class Trace(WireStruct, kw_only=True, frozen=True):
    trace_id: ShortText | None = None
    correlation_id: ShortText | None = None


class ApprovalRef(WireStruct, kw_only=True, frozen=True):
    """A pointer to a durable approval decision (a delegation request's); the pointer alone
    is never authority."""

    decision_id: ShortText


class DelegationRef(WireStruct, kw_only=True, frozen=True):
    delegation_id: ShortText
    parent_action_id: ActionId | None = None
    chain: Annotated[list[ShortText], msgspec.Meta(max_length=128)] = msgspec.field(
        default_factory=list
    )


JsonObject = dict[str, Any]


class Received(WireStruct, kw_only=True, frozen=True):
    """The AIP Envelope an Action arrived in, as far as its answers need it (the AIP reply
    recipe: `in_response_to` is this `message_id`, `to` is this `sender`). Set by the
    decoder (`worker/wire/actions.py`), never by a publisher."""

    message_id: ShortText
    #: The Envelope's `from` Principal, as received (None: it named no sender).
    sender: JsonObject | None = None


class Action(WireStruct, kw_only=True, frozen=True):
    """One invocation of one endpoint-qualified Hermes capability."""

    id: ActionId
    capability: CapabilityId
    input: JsonObject
    identity: Identity
    created_at_unix_ms: UnixMs
    mode: Mode = Mode.ASYNC
    idempotency_key: ShortText | None = None
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=86_400_000)] | None = None
    deadline_unix_ms: UnixMs | None = None
    trace: Trace | None = None
    #: The AIP decision the publisher carries (`approved`): a claim the worker checks field
    #: for field against the durable signed record (`worker.trust.approval_ledger`).
    approval: ApprovalDecision | None = None
    delegation: DelegationRef | None = None
    # Opaque to this worker but preserved: they belong to the AIP runtime around it.
    conversation: JsonObject | None = None
    memory: JsonObject | None = None
    federation: JsonObject | None = None
    callback: JsonObject | None = None
    observability: JsonObject | None = None
    compliance: JsonObject | None = None
    transaction: JsonObject | None = None
    #: Where the Action came from on the wire (None on an Action not yet published).
    received: Received | None = None
