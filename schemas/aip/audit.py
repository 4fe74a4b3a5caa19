"""Receipts, receipt chains, audit events and events (shared/reference/aip-1.0-wire.md
§1.15 to §1.17). A receipt's `hash` is the sha256 of the canonical JSON of the receipt without
`hash`; the chain's `root_hash` the sha256 of the receipts' hashes concatenated."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from schemas.aip._base import AipStruct, PageSize
from schemas.aip.common import IdentityContext, Principal, Timestamp

ReceiptType = Literal[
    "request_received",
    "action_accepted",
    "policy_decision",
    "approval_requested",
    "approval_granted",
    "approval_denied",
    "approval_expired",
    "approval_revoked",
    "tool_executed",
    "delegation_made",
    "human_approved",
    "result_returned",
    "settlement_recorded",
    "transaction_planned",
    "transaction_commit_started",
    "transaction_committed",
    "transaction_compensated",
    "transaction_dry_run_completed",
    "transaction_rollback_unsupported",
    "transaction_failed",
    "callback_delivery_attempted",
    "callback_delivered",
    "callback_delivery_failed",
]


class Receipt(AipStruct, frozen=True):
    """One link of an audit chain."""

    id: Annotated[str, Meta(description="Receipt id (`rcpt_…`).")]
    receipt_type: Annotated[ReceiptType, Meta(description="What it records.")]
    actor: Annotated[Principal, Meta(description="Who acted.")]
    occurred_at: Annotated[Timestamp, Meta(description="When.")]
    correlation_id: Annotated[str | None, Meta(description="Request correlation.")] = None
    data: Annotated[Any, Meta(description="Free details of what happened.")] = None
    previous_hash: Annotated[str | None, Meta(description="The previous receipt's `hash`.")] = None
    hash: Annotated[
        str | None, Meta(description="sha256 of this receipt's canonical JSON without `hash`.")
    ] = None


class ReceiptChain(AipStruct, frozen=True):
    """Receipts in order, with the hash over all of them."""

    chain_id: Annotated[str, Meta(description="The chain's id.")]
    receipts: Annotated[list[Receipt], Meta(description="The receipts, oldest first.")]
    root_hash: Annotated[
        str | None, Meta(description="sha256 of the receipts' hashes concatenated.")
    ] = None


class AuditEvent(AipStruct, frozen=True):
    """One audited act."""

    id: Annotated[str, Meta(description="Event id.")]
    actor: Annotated[Principal, Meta(description="Who acted.")]
    action: Annotated[str, Meta(min_length=1, description="The audited verb.")]
    occurred_at: Annotated[Timestamp, Meta(description="When.")]
    identity: Annotated[IdentityContext | None, Meta(description="Whose.")] = None
    data: Annotated[Any, Meta(description="Free details.")] = None


class Event(AipStruct, frozen=True):
    """A lifecycle event of a session or Action."""

    id: Annotated[str, Meta(description="Event id (`evt_…`).")]
    kind: Annotated[str, Meta(description="Event kind.")]
    occurred_at: Annotated[Timestamp, Meta(description="When.")]
    session_id: Annotated[str | None, Meta(description="Its session.")] = None
    action_id: Annotated[str | None, Meta(description="Its Action.")] = None
    correlation_id: Annotated[str | None, Meta(description="Request correlation.")] = None
    actor: Annotated[Principal | None, Meta(description="Who.")] = None
    data: Annotated[Any, Meta(description="Free event data.")] = None


class EventStream(AipStruct, frozen=True):
    """A page of events."""

    events: Annotated[list[Event], Meta(description="The events.")]
    next_cursor: Annotated[str | None, Meta(description="Cursor of the next page.")] = None


class EventStreamRequest(AipStruct, frozen=True):
    """A request for a page of events."""

    cursor: Annotated[str | None, Meta(description="Opaque cursor.")] = None
    limit: Annotated[PageSize | None, Meta(description="Page size.")] = None
    kinds: Annotated[list[str], Meta(description="Event kinds wanted.")] = msgspec.field(
        default_factory=list
    )
