"""An `Escalation` from a settled `ActionResult`: a pure function of the stored result.

Built from the stored result and the Action it answers, nothing else: a redelivery that
republishes a stored result builds the same escalation, under the same id, so the stream's
duplicate window drops the copy. The id is derived from the Action id and the approval
generation, so each prompt of a run gets its own escalation and a replay gets none.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from schemas.action import Action
from schemas.escalation import Escalation, EscalationApproval, EscalationKind
from schemas.ids import is_action_id
from schemas.operator import ApprovalChoice
from schemas.result import ActionResult, ResultStatus
from worker.escalation.rules import rule_for

#: The redacted prompt is already reduced to an allowlist; this bounds what is left.
MAX_PROMPT_BYTES = 8 * 1024
MAX_MESSAGE_CHARS = 2_000
_ALL_CHOICES = [choice for choice in ApprovalChoice]


def escalation_id(action_id: str, approval_generation: int) -> str:
    """`esc_` + 32 hex, one per Action id and approval generation."""
    digest = hashlib.sha256(f"escalation:{action_id}:{approval_generation}".encode()).hexdigest()
    return "esc_" + digest[:32]


def escalation_for(
    result: ActionResult, action: Action, *, approval_ttl_ms: int
) -> Escalation | None:
    """The escalation `result` raises, or None when the runbook leaves it to automation.

    `approval_ttl_ms` is how long a paused run keeps its place (the operator timeout): the
    approval escalation's deadline.
    """
    rule = rule_for(result)
    if rule is None:
        return None
    output = result.output if isinstance(result.output, dict) else {}
    approval = _approval(result, output)
    generation = approval.approval_generation if approval is not None else 0
    identity = action.identity
    endpoint = result.endpoint_id
    evidence = [
        f"aip-hermes-worker result {result.action_id} --endpoint {endpoint}",
        f"aip-hermes-worker audit {result.action_id} --endpoint {endpoint}",
    ]
    source = output.get("source_action_id")
    if isinstance(source, str) and is_action_id(source):
        evidence.append(f"aip-hermes-worker binding show {source}")
    error = result.error
    return Escalation(
        escalation_id=escalation_id(result.action_id, generation),
        kind=EscalationKind.APPROVAL if approval is not None else EscalationKind.DECISION,
        action_id=result.action_id,
        endpoint_id=endpoint,
        capability=result.capability,
        status=result.status,
        code=error.code if error else None,
        uncertain_outcome=bool(error and error.uncertain_outcome),
        message=error.message[:MAX_MESSAGE_CHARS] if error and error.message else None,
        decision=rule.decision,
        runbook=rule.runbook,
        principal_id=identity.principal_id,
        principal_kind=identity.principal_kind,
        tenant_id=identity.tenant_id,
        authentication_issuer=identity.authentication_issuer,
        credential_revision=identity.credential_revision,
        approval=approval,
        deadline_unix_ms=(
            result.settled_at_unix_ms + approval_ttl_ms if approval is not None else None
        ),
        evidence=evidence,
        raised_by=result.settled_by,
        fence=result.fence,
        raised_at_unix_ms=result.settled_at_unix_ms,
    )


def _approval(result: ActionResult, output: dict[str, Any]) -> EscalationApproval | None:
    """The pending approval of a `requires_human` operator result, redacted and bounded."""
    if result.status is not ResultStatus.REQUIRES_HUMAN:
        return None
    source = output.get("source_action_id")
    source_id = source if isinstance(source, str) and is_action_id(source) else result.action_id
    pending = output.get("pending_approval")
    prompt: dict[str, Any] = pending if isinstance(pending, dict) else {}
    if len(msgspec.json.encode(prompt)) > MAX_PROMPT_BYTES:
        prompt = {"omitted": f"the redacted prompt exceeds {MAX_PROMPT_BYTES} bytes"}
    generation = output.get("approval_generation")
    run_id = output.get("run_id")
    return EscalationApproval(
        source_action_id=source_id,
        approval_generation=generation if isinstance(generation, int) and generation >= 0 else 0,
        run_id=run_id if isinstance(run_id, str) else None,
        prompt=prompt,
        choices=_choices(prompt),
    )


def _choices(prompt: dict[str, Any]) -> list[ApprovalChoice]:
    """The choices Hermes offered (those this worker can send), else all four."""
    offered = prompt.get("choices")
    if isinstance(offered, list):
        known = [ApprovalChoice(c) for c in offered if c in ApprovalChoice._value2member_map_]
        if known:
            if ApprovalChoice.DENY not in known:
                known.append(ApprovalChoice.DENY)
            return known
    return list(_ALL_CHOICES)
