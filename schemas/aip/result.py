"""ActionResult, ProtocolError and the error body (shared/reference/aip-1.0-wire.md
§1.3, §1.4; upstream `action_result.schema.json`, `messages.rs`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from schemas.aip._base import AipStruct, UInt
from schemas.aip.common import MessagePart


class ResultStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PENDING_APPROVAL = "pending_approval"
    REQUIRES_HUMAN = "requires_human"


class ErrorCategory(StrEnum):
    """AIP's seven error categories."""

    TEMPORARY = "temporary"
    PERMANENT = "permanent"
    AUTH = "auth"
    POLICY = "policy"
    ECONOMIC = "economic"
    CONNECTOR = "connector"
    TRANSPORT = "transport"


class ProtocolError(AipStruct, frozen=True):
    """A typed failure; `details` holds what AIP has no field for (`uncertain_outcome`,
    `remote_status`, …)."""

    code: Annotated[str, Meta(description="Stable dot-separated lowercase code.")]
    message: Annotated[
        str, Meta(description="Human-readable message (hosts truncate to 1024 bytes).")
    ]
    category: Annotated[ErrorCategory, Meta(description="Error category.")]
    retryable: Annotated[bool | None, Meta(description="Whether a retry is safe.")] = None
    retry_after_ms: Annotated[UInt | None, Meta(description="Retry hint in ms.")] = None
    details: Annotated[Any, Meta(description="Free structured details.")] = None
    source: Annotated[Any, Meta(description="Free: the emitting component.")] = None


class ErrorBody(AipStruct, frozen=True):
    """The body of an `aip.core.v1.error` Envelope."""

    error: Annotated[ProtocolError, Meta(description="The error.")]


class Usage(AipStruct, frozen=True):
    """What a run used, as the provider reported it."""

    tokens: Annotated[Any, Meta(description="Free token counts.")] = None
    tools: Annotated[Any, Meta(description="Free tool usage.")] = None
    latency_ms: Annotated[UInt | None, Meta(description="Latency in ms.")] = None
    cost: Annotated[Any, Meta(description="Free cost.")] = None


class ReceiptRef(AipStruct, frozen=True):
    """A reference into the receipt chain."""

    id: Annotated[str, Meta(description="Receipt id (`rcpt_…`).")]
    hash: Annotated[str, Meta(description="The receipt's hash.")]


class ActionResult(AipStruct, frozen=True):
    """The outcome of one Action."""

    action_id: Annotated[str, Meta(description="The Action answered.")]
    status: Annotated[ResultStatus, Meta(description="Outcome.")]
    output: Annotated[Any, Meta(description="Free structured output.")] = None
    message: Annotated[list[MessagePart], Meta(description="User-facing message parts.")] = (
        msgspec.field(default_factory=list)
    )
    memory_update: Annotated[Any, Meta(description="Free memory update.")] = None
    usage: Annotated[Usage | None, Meta(description="What the run used.")] = None
    receipt: Annotated[ReceiptRef | None, Meta(description="Its receipt.")] = None
    error: Annotated[
        ProtocolError | None, Meta(description="The failure; required when `failed`.")
    ] = None
