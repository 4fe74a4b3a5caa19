"""The escalation subjects' wire: an internal `Escalation` as a signed AIP
`aip.core.v1.escalation` Envelope and an `EscalationResolution` as a signed
`aip.core.v1.escalation_resolution` Envelope, and back (docs/publishing.md "Escalation",
mapping of shared/reference/aip-1.0-wire.md §1.10 and §7.7).

Neither AIP type names an escalation or an Action, so the links are the Envelope's:

- the escalation id is the escalation Envelope's `message_id` (`msg_` + the id's 32 hex
  digits, as an Action's message id is `msg_` + its id's), and a resolution answers it with
  `in_response_to` = that `message_id`;
- the Action, endpoint, capability, fence and times travel in our extension.

The escalation body: `kind` approval → `approval`, decision → `policy_exception`; `reason`
= the worker's diagnostic (else the runbook decision); `requested_by` = the worker that
raised it; `form` holds everything a person needs to decide (status, code,
uncertain_outcome, decision, runbook, evidence, whose Action it was, the approval's
facts); `allowed_decisions` maps the offered choices (once/session/always → approve, deny
→ reject; the exact choices stay in `form`); `risk` is the capability's; `timeout_ms` runs
from `sent_at` (= the raise time) to the deadline.

The resolution body: `status` approved (an allowing choice) / rejected (deny) /
handoff_completed (acknowledged), `resolved_by` the person, `resolved_at`, and `result`
{reason, choice, resume_action_id}.

The Envelope bytes are a function of the escalation (or resolution) alone (message id and
`sent_at` come from it, Ed25519 is deterministic), so a republish is byte-identical.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from schemas.aip.escalation import Escalation as AipEscalation
from schemas.aip.escalation import EscalationResolution as AipResolution
from schemas.aip.extensions import EscalationExtension, ResolutionExtension
from schemas.escalation import (
    Escalation,
    EscalationKind,
    EscalationResolution,
    ResolutionKind,
    is_escalation_id,
)
from schemas.operator import ApprovalChoice
from worker.aip.signing import AipSigner
from worker.wire.actions import timestamp_of_ms
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    Opened,
    extension_as,
    invalid,
    open_envelope,
    open_payload,
    seal,
    unix_ms_of,
)
from worker.wire.results import worker_principal

ESCALATION_TYPE: Final = "aip.core.v1.escalation"
RESOLUTION_TYPE: Final = "aip.core.v1.escalation_resolution"
_ESCALATION_TYPES: Final = frozenset({ESCALATION_TYPE})
_RESOLUTION_TYPES: Final = frozenset({RESOLUTION_TYPE})

_KIND_TO_AIP: Final = {
    EscalationKind.APPROVAL: "approval",
    EscalationKind.DECISION: "policy_exception",
}
_KIND_FROM_AIP: Final = {value: kind for kind, value in _KIND_TO_AIP.items()}
#: What a person may decide on an escalation that is not an approval: take it over.
_DECISION_ALLOWED: Final = ("handoff",)


def escalation_message_id(escalation_id: str) -> str:
    """The `message_id` of an escalation's Envelope: `msg_` + its id's 32 hex digits."""
    return "msg_" + escalation_id.removeprefix("esc_")


def escalation_id_of(message_id: str) -> str:
    """The escalation id a `message_id` (or an `in_response_to`) names; EnvelopeRejected
    when it is not of the escalation Envelope's form."""
    candidate = "esc_" + message_id.removeprefix("msg_")
    if not message_id.startswith("msg_") or not is_escalation_id(candidate):
        raise invalid(f"{message_id[:80]!r} does not name an escalation (msg_ + 32 hex)")
    return candidate


def resolution_message_id(escalation_id: str) -> str:
    """The `message_id` of a resolution's Envelope: derived from the escalation id (one
    resolution per escalation, write-once), so a repeated `resolve` republishes the same
    bytes."""
    digest = hashlib.sha256(f"resolution:{escalation_id}".encode()).hexdigest()
    return "msg_" + digest[:32]


def raiser_principal(raised_by: str) -> dict[str, str]:
    """`requested_by` of an escalation: the worker (a service) whose settle raised it."""
    return {"id": raised_by, "kind": "service"}


def resolver_principal(resolved_by: str) -> dict[str, str]:
    """`resolved_by` (and the Envelope's `from`) of a resolution: the person who decided."""
    return {"id": resolved_by, "kind": "human"}


def allowed_decisions(escalation: Escalation) -> list[str]:
    """The AIP decisions an escalation offers: its choices mapped (once/session/always →
    approve, deny → reject), or a handoff for anything but an approval."""
    if escalation.approval is None:
        return list(_DECISION_ALLOWED)
    decisions: list[str] = []
    for choice in escalation.approval.choices:
        decision = "reject" if choice is ApprovalChoice.DENY else "approve"
        if decision not in decisions:
            decisions.append(decision)
    return decisions


def _form(escalation: Escalation) -> dict[str, Any]:
    principal: dict[str, Any] = {
        "principal_id": escalation.principal_id,
        "principal_kind": escalation.principal_kind,
        "tenant_id": escalation.tenant_id,
        "authentication_issuer": escalation.authentication_issuer,
        "credential_revision": escalation.credential_revision,
    }
    form: dict[str, Any] = {
        "status": escalation.status.value,
        "code": escalation.code.value if escalation.code is not None else None,
        "uncertain_outcome": escalation.uncertain_outcome,
        "decision": escalation.decision,
        "runbook": escalation.runbook,
        "evidence": list(escalation.evidence),
        "principal": {k: v for k, v in principal.items() if v is not None},
    }
    if escalation.approval is not None:
        approval = msgspec.to_builtins(escalation.approval)
        form["approval"] = {k: v for k, v in approval.items() if v is not None}
    return {k: v for k, v in form.items() if v is not None}


def encode_escalation(
    escalation: Escalation, *, signer: AipSigner | None, risk: str | None = None
) -> bytes:
    """The wire bytes of `escalation`: an `escalation` Envelope signed by the worker's
    response key `signer` (None: unsigned, development only), `risk` the capability's."""
    payload: dict[str, Any] = {
        "kind": _KIND_TO_AIP[escalation.kind],
        "reason": escalation.message if escalation.message else escalation.decision,
        "requested_by": raiser_principal(escalation.raised_by),
        "form": _form(escalation),
        "allowed_decisions": allowed_decisions(escalation),
    }
    if risk is not None:
        payload["risk"] = risk
    if escalation.deadline_unix_ms is not None:
        payload["timeout_ms"] = max(0, escalation.deadline_unix_ms - escalation.raised_at_unix_ms)
    extension = msgspec.to_builtins(
        EscalationExtension(
            action_id=escalation.action_id,
            endpoint_id=escalation.endpoint_id,
            capability=escalation.capability,
            fence=escalation.fence,
            raised_at_unix_ms=escalation.raised_at_unix_ms,
        )
    )
    return seal(
        ESCALATION_TYPE,
        payload,
        sender=worker_principal(escalation.endpoint_id),
        signer=signer,
        extension=extension,
        message_id=escalation_message_id(escalation.escalation_id),
        sent_at=timestamp_of_ms(escalation.raised_at_unix_ms),
    )


class _Form(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """The `form` this worker writes (a reader refuses anything else on its subject)."""

    status: str
    code: str | None = None
    uncertain_outcome: bool = False
    decision: str
    runbook: str
    evidence: list[str]
    principal: dict[str, Any]
    approval: dict[str, Any] | None = None


def decode_escalation(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[Escalation, Opened]:
    """The internal escalation in `data` and the Envelope it came in (its signature, if
    any, verified; which keys to trust is the caller's decision, `Opened.verified.did`).

    EnvelopeRejected for anything that is not an `escalation` Envelope carrying one of ours
    (`envelope.decode.invalid`, `schema.envelope.invalid`, `connector_host.authentication`)."""
    opened = open_envelope(data, message_types=_ESCALATION_TYPES, max_bytes=max_bytes)
    body = open_payload(opened, ESCALATION_TYPE)
    assert isinstance(body, AipEscalation)
    extension = extension_as(opened, EscalationExtension)
    try:
        form = msgspec.convert(body.form, _Form, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"escalation: {exc}") from None
    kind = _KIND_FROM_AIP.get(body.kind)
    if kind is None:
        raise invalid(f"escalation kind {body.kind!r} is not one this worker raises")
    deadline = (
        extension.raised_at_unix_ms + body.timeout_ms if body.timeout_ms is not None else None
    )
    document = {
        "escalation_id": escalation_id_of(opened.message_id),
        "kind": kind.value,
        "action_id": extension.action_id,
        "endpoint_id": extension.endpoint_id,
        "capability": extension.capability,
        "status": form.status,
        "code": form.code,
        "uncertain_outcome": form.uncertain_outcome,
        "message": body.reason if body.reason != form.decision else None,
        "decision": form.decision,
        "runbook": form.runbook,
        **form.principal,
        "approval": form.approval,
        "deadline_unix_ms": deadline,
        "evidence": form.evidence,
        "raised_by": body.requested_by.id,
        "fence": extension.fence,
        "raised_at_unix_ms": extension.raised_at_unix_ms,
    }
    try:
        escalation = msgspec.convert(document, Escalation, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"escalation: {exc}") from None
    if allowed_decisions(escalation) != list(body.allowed_decisions):
        raise invalid("allowed_decisions do not match the escalation's choices")
    return escalation, opened


def _status(resolution: EscalationResolution) -> str:
    if resolution.kind is ResolutionKind.ACKNOWLEDGED:
        return "handoff_completed"
    return "rejected" if resolution.choice is ApprovalChoice.DENY else "approved"


def encode_resolution(resolution: EscalationResolution, *, signer: AipSigner | None) -> bytes:
    """The wire bytes of `resolution`: an `escalation_resolution` Envelope answering the
    escalation's Envelope, from (and signed by, when `signer` is given) the person who
    resolved it."""
    result: dict[str, Any] = {"reason": resolution.reason}
    if resolution.choice is not None:
        result["choice"] = resolution.choice.value
    if resolution.resume_action_id is not None:
        result["resume_action_id"] = resolution.resume_action_id
    person = resolver_principal(resolution.resolved_by)
    return seal(
        RESOLUTION_TYPE,
        {
            "status": _status(resolution),
            "resolved_by": person,
            "resolved_at": timestamp_of_ms(resolution.resolved_at_unix_ms),
            "result": result,
        },
        sender=person,
        signer=signer,
        in_response_to=escalation_message_id(resolution.escalation_id),
        extension=msgspec.to_builtins(
            ResolutionExtension(
                action_id=resolution.action_id,
                endpoint_id=resolution.endpoint_id,
                resolved_at_unix_ms=resolution.resolved_at_unix_ms,
            )
        ),
        message_id=resolution_message_id(resolution.escalation_id),
        sent_at=timestamp_of_ms(resolution.resolved_at_unix_ms),
    )


class _Result(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    reason: str
    choice: str | None = None
    resume_action_id: str | None = None


def decode_resolution(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[EscalationResolution, Opened]:
    """The internal resolution in `data` and its Envelope (signature, if any, verified);
    EnvelopeRejected as `decode_escalation`, and for a status that contradicts its choice
    or a `resolved_by` other than the Envelope's sender."""
    opened = open_envelope(data, message_types=_RESOLUTION_TYPES, max_bytes=max_bytes)
    body = open_payload(opened, RESOLUTION_TYPE)
    assert isinstance(body, AipResolution)
    extension = extension_as(opened, ResolutionExtension)
    try:
        result = msgspec.convert(body.result, _Result, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"escalation_resolution: {exc}") from None
    answers = opened.envelope.get("in_response_to")
    if not isinstance(answers, str):
        raise invalid("escalation_resolution: in_response_to (the escalation) is required")
    sender = opened.sender
    if sender is None or sender.get("id") != body.resolved_by.id:
        raise invalid("escalation_resolution: resolved_by is not the Envelope's sender")
    acknowledged = body.status == "handoff_completed"
    kind = ResolutionKind.ACKNOWLEDGED if acknowledged else ResolutionKind.ANSWERED
    try:
        resolution = msgspec.convert(
            {
                "escalation_id": escalation_id_of(answers),
                "action_id": extension.action_id,
                "endpoint_id": extension.endpoint_id,
                "kind": kind.value,
                "resolved_by": body.resolved_by.id,
                "reason": result.reason,
                "resolved_at_unix_ms": extension.resolved_at_unix_ms,
                "choice": result.choice,
                "resume_action_id": result.resume_action_id,
            },
            EscalationResolution,
            strict=True,
        )
    except msgspec.ValidationError as exc:
        raise invalid(f"escalation_resolution: {exc}") from None
    if acknowledged != (resolution.choice is None and resolution.resume_action_id is None):
        raise invalid(
            "escalation_resolution: an answered approval names its choice, a handoff none"
        )
    if _status(resolution) != body.status:
        raise invalid(f"escalation_resolution: status {body.status} contradicts its result")
    if unix_ms_of(body.resolved_at) != resolution.resolved_at_unix_ms:
        raise invalid("escalation_resolution: resolved_at differs from resolved_at_unix_ms")
    return resolution, opened



__all__ = [
    "ESCALATION_TYPE",
    "RESOLUTION_TYPE",
    "allowed_decisions",
    "decode_escalation",
    "decode_resolution",
    "encode_escalation",
    "encode_resolution",
    "escalation_id_of",
    "escalation_message_id",
    "raiser_principal",
    "resolution_message_id",
    "resolver_principal",
]
