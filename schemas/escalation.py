"""Escalation and EscalationResolution: what reaches a human when an Action ends in a state
only a human may decide, and how it was answered.

Both travel on `aip.hermes.{endpoint}.escalations` (stream `AIP_HERMES_ESCALATIONS`): an
Escalation under `Nats-Msg-Id` = its id (write-once per Action and approval generation),
its resolution on `aip.hermes.{endpoint}.escalations.resolved` under `{id}:resolved`.
Neither carries a secret or provider text beyond the redacted approval prompt.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

import msgspec

from schemas._base import WireStruct
from schemas.errors import ErrorCode
from schemas.ids import ActionId, CapabilityId, EndpointId, ShortText, UnixMs
from schemas.operator import ApprovalChoice
from schemas.result import ResultStatus

ESCALATION_ID_PATTERN = r"^esc_[0-9a-f]{32}\Z"
_ESCALATION_ID_RE = re.compile(ESCALATION_ID_PATTERN)

EscalationId = Annotated[str, msgspec.Meta(pattern=ESCALATION_ID_PATTERN)]
#: Free text a person wrote or reads: bounded, never a provider body.
HumanText = Annotated[str, msgspec.Meta(min_length=1, max_length=2_000)]


def is_escalation_id(value: str) -> bool:
    return bool(_ESCALATION_ID_RE.fullmatch(value))


class EscalationKind(StrEnum):
    #: A provider approval waits: resolving it publishes a resume Action with the choice.
    APPROVAL = "approval"
    #: Anything else a human must decide: resolving it records who acknowledged it and why.
    DECISION = "decision"


class EscalationApproval(WireStruct, kw_only=True, frozen=True):
    """The pending provider approval, as the operator binding retained it (redacted)."""

    source_action_id: ActionId
    approval_generation: Annotated[int, msgspec.Meta(ge=0)]
    run_id: str | None = None
    #: The redacted approval prompt (`pending_approval` of the binding), bounded.
    prompt: dict[str, Any]
    choices: list[ApprovalChoice]


class Escalation(WireStruct, kw_only=True, frozen=True):
    """One Action's terminal state that a human must decide (the runbook's escalate,
    reconcile, isolate and preserve decisions, and every `requires_human`)."""

    escalation_id: EscalationId
    kind: EscalationKind
    action_id: ActionId
    endpoint_id: EndpointId
    capability: CapabilityId
    status: ResultStatus
    #: The result's error code; None for `requires_human`.
    code: ErrorCode | None = None
    uncertain_outcome: bool = False
    #: The worker's own diagnostic (never a provider body), bounded.
    message: HumanText | None = None
    #: The runbook's decision for this state, and the runbook section it comes from.
    decision: HumanText
    runbook: ShortText
    #: Who the Action was for (tenant-safe ids only), so a resume runs as the same principal.
    principal_id: ShortText
    principal_kind: ShortText
    tenant_id: ShortText | None = None
    authentication_issuer: ShortText | None = None
    credential_revision: Annotated[int, msgspec.Meta(ge=0)] | None = None
    approval: EscalationApproval | None = None
    #: When the decision stops being useful (an approval: the run's slot is released), or None.
    deadline_unix_ms: UnixMs | None = None
    #: Commands that show the evidence (result, receipts, binding).
    evidence: list[ShortText]
    raised_by: ShortText
    fence: Annotated[int, msgspec.Meta(ge=0)]
    raised_at_unix_ms: UnixMs


class ResolutionKind(StrEnum):
    #: An approval answered: `resume_action_id` carries the choice to the paused run.
    ANSWERED = "answered"
    #: Any other escalation: a person took it over.
    ACKNOWLEDGED = "acknowledged"


class EscalationResolution(WireStruct, kw_only=True, frozen=True):
    """Who resolved an escalation, how and why (write-once in Redis, copied to the stream)."""

    escalation_id: EscalationId
    action_id: ActionId
    endpoint_id: EndpointId
    kind: ResolutionKind
    resolved_by: ShortText
    reason: HumanText
    resolved_at_unix_ms: UnixMs
    choice: ApprovalChoice | None = None
    resume_action_id: ActionId | None = None


class ResumeClaim(WireStruct, kw_only=True, frozen=True):
    """The resume an approval escalation's first approver opened, write-once in Redis
    (never on a stream: its id stays unknown until the resume is published). Every member
    of the quorum approves this same resume; a member who disagrees answers `deny`."""

    escalation_id: EscalationId
    resume_action_id: ActionId
    choice: ApprovalChoice
    resolve_all: bool
    opened_by: ShortText
