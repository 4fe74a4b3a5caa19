"""Lifecycle queries and answers, and the approval queries (shared/reference/aip-1.0-wire.md
§1.7, §1.11). Our lease and fence facts go in `ActionStatus.lease`."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import Meta

from schemas.aip._base import AipStruct, PageSize, WaitMs
from schemas.aip.approval import ApprovalDecision, ApprovalRequest, EvidencePayload
from schemas.aip.audit import Event, ReceiptChain
from schemas.aip.common import Timestamp
from schemas.aip.result import ActionResult, ResultStatus
from schemas.aip.stream import StreamChunk

_Flag = Annotated[bool | msgspec.UnsetType, Meta(description="Default false; always written.")]


class ActionState(StrEnum):
    UNKNOWN = "unknown"
    ACCEPTED = "accepted"
    QUEUED = "queued"
    RUNNING = "running"
    STREAMING = "streaming"
    PENDING_APPROVAL = "pending_approval"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    DEAD_LETTERED = "dead_lettered"


class ActionStatusRequest(AipStruct, frozen=True):
    """Where an Action stands."""

    __aip_defaults__: ClassVar[dict[str, Any]] = {
        "include_result": False,
        "include_receipts": False,
        "include_chunks": False,
    }

    action_id: Annotated[str, Meta(description="The Action.")]
    tenant_id: Annotated[str | None, Meta(description="The tenant the caller expects.")] = None
    include_result: _Flag = msgspec.UNSET
    include_receipts: _Flag = msgspec.UNSET
    include_chunks: _Flag = msgspec.UNSET
    wait_ms: Annotated[WaitMs | None, Meta(description="Bounded wait in ms.")] = None


class ActionStatus(AipStruct, frozen=True):
    """An Action's durable state."""

    action_id: Annotated[str, Meta(description="The Action.")]
    state: Annotated[ActionState, Meta(description="Its state.")]
    updated_at: Annotated[Timestamp, Meta(description="Last durable update.")]
    capability_id: Annotated[str | None, Meta(description="Its capability.")] = None
    session_id: Annotated[str | None, Meta(description="Its session.")] = None
    correlation_id: Annotated[str | None, Meta(description="Its correlation id.")] = None
    queued_state: Annotated[str | None, Meta(description="Backend queue state label.")] = None
    result_status: Annotated[ResultStatus | None, Meta(description="Terminal result status.")] = (
        None
    )
    approval_id: Annotated[str | None, Meta(description="Its approval.")] = None
    transaction_id: Annotated[str | None, Meta(description="Its transaction.")] = None
    delegation_id: Annotated[str | None, Meta(description="Its delegation.")] = None
    started_at: Annotated[str | None, Meta(description="RFC 3339 start.")] = None
    completed_at: Annotated[str | None, Meta(description="RFC 3339 end.")] = None
    retry: Annotated[Any, Meta(description="Free retry facts.")] = None
    lease: Annotated[Any, Meta(description="Free lease facts (owner, fence).")] = None
    result: Annotated[ActionResult | None, Meta(description="Its result.")] = None
    receipt_chain: Annotated[ReceiptChain | None, Meta(description="Its receipts.")] = None
    chunks: Annotated[list[StreamChunk], Meta(description="Its chunks.")] = msgspec.field(
        default_factory=list
    )
    links: Annotated[dict[str, str], Meta(description="Typed links.")] = msgspec.field(
        default_factory=dict
    )


class ActionList(AipStruct, frozen=True):
    """A list of ActionStatus views (`aip.lifecycle.v1.action_list`)."""

    actions: Annotated[list[ActionStatus], Meta(description="The Actions listed.")]
    total_size: Annotated[int, Meta(ge=0, description="How many Actions match, before pagination.")]
    cursor: Annotated[str | None, Meta(description="Cursor of the next page.")] = None


class ActionResultRequest(AipStruct, frozen=True):
    """An Action's result."""

    __aip_defaults__: ClassVar[dict[str, Any]] = {
        "include_receipt": False,
        "include_terminal_events": False,
    }

    action_id: Annotated[str, Meta(description="The Action.")]
    tenant_id: Annotated[str | None, Meta(description="The tenant the caller expects.")] = None
    wait_ms: Annotated[WaitMs | None, Meta(description="Bounded wait in ms.")] = None
    include_receipt: _Flag = msgspec.UNSET
    include_terminal_events: _Flag = msgspec.UNSET


class ActionEventsRequest(AipStruct, frozen=True):
    """A page of an Action's events."""

    __aip_defaults__: ClassVar[dict[str, Any]] = {"include_chunks": False, "follow": False}

    action_id: Annotated[str, Meta(description="The Action.")]
    tenant_id: Annotated[str | None, Meta(description="The tenant the caller expects.")] = None
    cursor: Annotated[str | None, Meta(description="Opaque cursor.")] = None
    limit: Annotated[PageSize | None, Meta(description="Page size.")] = None
    kinds: Annotated[
        list[Annotated[str, Meta(min_length=1)]], Meta(description="Event kinds wanted.")
    ] = msgspec.field(default_factory=list)
    include_chunks: _Flag = msgspec.UNSET
    follow: _Flag = msgspec.UNSET


class ActionEvents(AipStruct, frozen=True):
    """A page of an Action's events."""

    action_id: Annotated[str, Meta(description="The Action.")]
    events: Annotated[list[Event], Meta(description="Its events.")]
    terminal: Annotated[bool, Meta(description="Whether the Action has ended.")]
    chunks: Annotated[list[StreamChunk], Meta(description="Its chunks.")] = msgspec.field(
        default_factory=list
    )
    cursor: Annotated[str | None, Meta(description="Cursor of the next page.")] = None


class ApprovalQueryRequest(AipStruct, frozen=True):
    """One approval record."""

    __aip_defaults__: ClassVar[dict[str, Any]] = {
        "include_action_status": False,
        "include_receipts": False,
        "include_evidence_payload": False,
    }

    approval_id: Annotated[str, Meta(description="The approval.")]
    tenant_id: Annotated[str | None, Meta(description="The tenant the caller expects.")] = None
    include_action_status: _Flag = msgspec.UNSET
    include_receipts: _Flag = msgspec.UNSET
    include_evidence_payload: _Flag = msgspec.UNSET


class ApprovalRecordView(AipStruct, frozen=True):
    """An approval request with its decision, as stored."""

    request: Annotated[ApprovalRequest, Meta(description="The request.")]
    status: Annotated[str, Meta(description="Label: `pending`, `approved`, `denied`, …")]
    created_at: Annotated[Timestamp, Meta(description="When it was requested.")]
    updated_at: Annotated[Timestamp, Meta(description="Last change.")]
    decision: Annotated[
        ApprovalDecision | None, Meta(description="Its decision (same approval id).")
    ] = None
    action_status: Annotated[ActionStatus | None, Meta(description="The Action's state.")] = None
    receipt_chain: Annotated[ReceiptChain | None, Meta(description="Its receipts.")] = None
    evidence_payload: Annotated[
        EvidencePayload | None, Meta(description="The sensitive evidence (export only).")
    ] = None
