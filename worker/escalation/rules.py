"""Which terminal states a human must decide: the one table, taken from docs/runbook.md.

A result escalates when

- its status is `requires_human` (a provider approval waits: an `approval` escalation), or
- its code is in `ESCALATE` with `Need.ALWAYS` (the runbook says escalate, reconcile,
  isolate or preserve whatever the flags say), or
- its code is in `ESCALATE` with `Need.UNCERTAIN` and the result says
  `uncertain_outcome: true` (the runbook's "unsafe: reconcile" rows: Hermes may have acted).

Everything else (correct, wait, retry a read) is decided by the publisher's automation,
not a person, and raises nothing. `tests/unit/test_escalation_rules.py` checks that every
code the runbook tells a person to escalate or reconcile is in the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from schemas.errors import ErrorCode
from schemas.result import ActionResult, ResultStatus

C = ErrorCode


class Need(Enum):
    ALWAYS = "always"
    UNCERTAIN = "uncertain"


@dataclass(frozen=True, slots=True)
class Rule:
    need: Need
    #: The runbook's decision, as a person reads it in the escalation.
    decision: str
    #: The runbook section the row comes from.
    runbook: str


_OPERATOR = "docs/runbook.md#operator-codes"
_BASE = "docs/runbook.md#base-connector-codes"
_HOST = "docs/runbook.md#envelope-and-host-codes"
_STREAM = "docs/runbook.md#stream-codes"
_DELEGATED = "docs/runbook.md#delegated-result-codes"

_RECONCILE_UNSAFE = (
    "Reconcile with the state owner (read the session, job, response or run with read-only "
    "Actions); Hermes may have acted. Do not resend the request"
)

#: The approval decision (status `requires_human`, no code).
APPROVAL_DECISION = (
    "A provider approval waits on the paused run: answer it once with "
    "`aip-hermes-worker escalations resolve ID --choice once|session|always|deny`. "
    "A cancel does not stop a waiting run; deny it instead"
)
APPROVAL_RUNBOOK = "docs/runbook.md#an-operator-stays-at-requires_human"

ESCALATE: dict[ErrorCode, Rule] = {
    C.OPERATOR_OUTCOME_UNKNOWN: Rule(
        Need.ALWAYS,
        "Reconcile the binding (`binding show`, `reconcile`). Never replay POST /v1/runs",
        _OPERATOR,
    ),
    C.APPROVAL_OUTCOME_UNKNOWN: Rule(
        Need.ALWAYS,
        "Reconcile: do not resend the choice. Inspect the same run and generation in "
        "`binding show` (approval_commands)",
        _OPERATOR,
    ),
    C.CANCELLATION_OUTCOME_UNKNOWN: Rule(
        Need.ALWAYS,
        "Escalate: treat earlier effects as uncertain, read the run (run_status), stop it "
        "with run_stop if it still runs, then `reconcile`",
        _OPERATOR,
    ),
    C.OPERATOR_INTERRUPTED: Rule(
        Need.ALWAYS,
        "Reconcile: the run was interrupted by a Hermes shutdown and will not continue; its "
        "tools may have acted. Inspect their effects (`binding show`) before new work",
        _OPERATOR,
    ),
    C.OPERATOR_STATE: Rule(
        Need.ALWAYS,
        "Escalate to whoever owns Redis: restore it and look at the binding (`binding show`). "
        "Do not work around it with a new Action id while its run may be going",
        _BASE,
    ),
    C.ERROR: Rule(
        Need.ALWAYS,
        "Escalate with `binding show` output, the result and the worker logs",
        _BASE,
    ),
    C.STREAM_PUBLICATION: Rule(
        Need.ALWAYS,
        "Reconcile: keep the published chunks and the provider state; do not restart the "
        "operation. Check NATS",
        _BASE,
    ),
    C.HOST_EXECUTION: Rule(
        Need.ALWAYS,
        "Read the durable Action (result, audit; for the operator `binding show`) and the "
        "worker log; unsafe with uncertain_outcome: reconcile. Escalate the log lines",
        _HOST,
    ),
    C.TRANSPORT: Rule(Need.UNCERTAIN, _RECONCILE_UNSAFE, _BASE),
    C.REMOTE_TEMPORARY: Rule(Need.UNCERTAIN, _RECONCILE_UNSAFE, _BASE),
    C.DEADLINE_EXCEEDED: Rule(
        Need.UNCERTAIN, "Reconcile: provider work may continue past the deadline", _BASE
    ),
    C.STREAM_TRUNCATED: Rule(
        Need.UNCERTAIN,
        "Reconcile: read the published chunks and provider state; do not rerun unsafe generation",
        _STREAM,
    ),
    C.STREAM_INCOMPLETE: Rule(
        Need.UNCERTAIN,
        "Treat as not finished or uncertain until the state owner says otherwise; reconcile. "
        "Do not start a second model turn to recover text",
        _STREAM,
    ),
    C.DELEGATED_ACTION_CONTRACT_MISMATCH: Rule(
        Need.ALWAYS, "Isolate the route; keep both records", _DELEGATED
    ),
    C.DELEGATED_IDENTITY_MISMATCH: Rule(
        Need.ALWAYS, "Isolate the child created by the wrong Hermes principal", _DELEGATED
    ),
    C.DELEGATED_IDENTITY_INTEGRITY: Rule(
        Need.ALWAYS, "Preserve the Action and identity records; fail closed", _DELEGATED
    ),
    C.DELEGATED_TENANT_MISMATCH: Rule(
        Need.ALWAYS, "Isolate cross-tenant execution; preserve evidence", _DELEGATED
    ),
    C.DELEGATED_RESULT_INTEGRITY: Rule(
        Need.ALWAYS, "Preserve the queue and lifecycle records", _DELEGATED
    ),
}


def rule_for(result: ActionResult) -> Rule | None:
    """The rule that makes `result` an escalation, or None when no human must decide."""
    if result.status is ResultStatus.REQUIRES_HUMAN:
        return Rule(Need.ALWAYS, APPROVAL_DECISION, APPROVAL_RUNBOOK)
    if result.error is None:
        return None
    rule = ESCALATE.get(result.error.code)
    if rule is None:
        return None
    if rule.need is Need.UNCERTAIN and not result.error.uncertain_outcome:
        return None
    return rule
