"""Escalation and EscalationResolution (shared/reference/aip-1.0-wire.md §1.10). Neither
names an escalation or an Action: the Envelope's `correlation_id`, `session_id` and
`in_response_to` link them; what we need beyond that is in `form` and `result`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from schemas.aip._base import AipStruct, UInt
from schemas.aip.common import Conversation, Principal, Risk, Timestamp

EscalationDecision = Literal["approve", "reject", "modify", "handoff", "cancel"]


class Escalation(AipStruct, frozen=True):
    """A request for a human."""

    kind: Annotated[
        Literal["approval", "input", "handoff", "policy_exception"],
        Meta(description="What is asked of the human."),
    ]
    reason: Annotated[str, Meta(description="Human-readable reason.")]
    requested_by: Annotated[Principal, Meta(description="Who escalates.")]
    form: Annotated[Any, Meta(description="Free form: runbook, choices, references.")] = None
    risk: Annotated[Risk | None, Meta(description="Risk.")] = None
    timeout_ms: Annotated[UInt | None, Meta(description="How long it waits.")] = None
    allowed_decisions: Annotated[
        list[EscalationDecision], Meta(description="Decisions the human may take.")
    ] = msgspec.field(default_factory=list)
    conversation: Annotated[Conversation | None, Meta(description="The thread.")] = None


class EscalationResolution(AipStruct, frozen=True):
    """A human's answer to an escalation."""

    status: Annotated[
        Literal["approved", "rejected", "modified", "handoff_completed", "expired", "cancelled"],
        Meta(description="The resolution."),
    ]
    resolved_by: Annotated[Principal, Meta(description="Who resolved it.")]
    resolved_at: Annotated[Timestamp, Meta(description="When.")]
    result: Annotated[Any, Meta(description="Free: the modified payload or the result.")] = None
