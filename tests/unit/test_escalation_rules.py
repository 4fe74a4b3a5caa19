"""The escalation table against docs/runbook.md, and the Escalation built from a result.

Every code whose runbook decision tells a person to escalate, reconcile, isolate or
preserve is in `ESCALATE` (or exempt below, with the reason), and every code in the table
has such a row: the table cannot drift from the page people read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from schemas.action import Action, Identity
from schemas.errors import ErrorCode
from schemas.escalation import Escalation, EscalationKind
from schemas.operator import ApprovalChoice
from schemas.result import ActionResult, ResultStatus
from worker.errors import ConnectorError
from worker.escalation.build import MAX_PROMPT_BYTES, escalation_for, escalation_id
from worker.escalation.rules import ESCALATE, Need

RUNBOOK = Path(__file__).parents[2] / "docs" / "runbook.md"
HUMAN = re.compile(r"\*\*(escalate|reconcile)\*\*|\b(isolate|preserve)\b", re.IGNORECASE)
#: Runbook rows that mention reconciling but that no escalation is raised for, and why.
EXEMPT = {
    # A cancel someone asked for: the requester already decided; the result says cancelled.
    ErrorCode.CANCELLED,
    # Dead-lettered, never settled: no result exists to escalate; the DLQ entry is the record.
    ErrorCode.HOST_REPLAY,
    # A deployment fault, not a decision about one Action: a worker without its signing key
    # refuses every Action alike; its start-up warning and the refusal metrics report it once,
    # where an escalation per refused Action would bury the ones a person must decide.
    ErrorCode.HOST_RESPONSE_SIGNING,
}
ACTION_ID = "act_" + "1" * 32
SOURCE_ID = "act_" + "2" * 32
CAPABILITY = "cap:hermes_agent:h1:operator"


def _runbook_decisions() -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in RUNBOOK.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\| `([a-z_.]+)` \|", line)
        if match:
            rows.setdefault(match.group(1), line.rsplit("|", 2)[-2])
    return rows


def test_every_code_the_runbook_gives_to_a_person_escalates() -> None:
    decisions = _runbook_decisions()
    wanted = {
        ErrorCode(code)
        for code, decision in decisions.items()
        if HUMAN.search(decision) and code in ErrorCode._value2member_map_
    }
    assert wanted - EXEMPT - set(ESCALATE) == set()
    for code in ESCALATE:
        assert HUMAN.search(decisions[code.value]), code


def _action() -> Action:
    return Action(
        id=ACTION_ID,
        capability=CAPABILITY,
        input={"objective": "x"},
        identity=Identity(principal_id="user:demo", principal_kind="user", credential_revision=1),
        created_at_unix_ms=1,
    )


def _result(
    status: ResultStatus, error: ConnectorError | None = None, **output: Any
) -> ActionResult:
    return ActionResult(
        action_id=ACTION_ID,
        capability=CAPABILITY,
        endpoint_id="h1",
        status=status,
        output=output or None,
        error=error.to_protocol(endpoint_id="h1", read_only=False) if error else None,
        settled_by="w1",
        fence=2,
        settled_at_unix_ms=1_000,
    )


def _approval_result(generation: int, prompt: dict[str, Any]) -> ActionResult:
    return _result(
        ResultStatus.REQUIRES_HUMAN,
        source_action_id=SOURCE_ID,
        run_id="run_" + "3" * 32,
        pending_approval=prompt,
        approval_generation=generation,
    )


def test_requires_human_is_an_approval_escalation_with_the_redacted_prompt() -> None:
    prompt = {"event": "approval.request", "description": "chmod", "choices": ["once", "deny"]}
    escalation = escalation_for(_approval_result(1, prompt), _action(), approval_ttl_ms=60_000)
    assert escalation is not None
    assert escalation.kind is EscalationKind.APPROVAL
    assert escalation.approval is not None
    assert escalation.approval.source_action_id == SOURCE_ID
    assert escalation.approval.prompt == prompt
    assert escalation.approval.choices == [ApprovalChoice.ONCE, ApprovalChoice.DENY]
    assert escalation.deadline_unix_ms == 61_000
    assert escalation.escalation_id == escalation_id(ACTION_ID, 1)
    assert f"aip-hermes-worker binding show {SOURCE_ID}" in escalation.evidence
    # The wire type round-trips strictly.
    assert msgspec.json.decode(msgspec.json.encode(escalation), type=Escalation) == escalation


def test_each_generation_gets_its_own_id_and_a_rebuild_the_same_one() -> None:
    first = escalation_for(_approval_result(1, {}), _action(), approval_ttl_ms=1)
    again = escalation_for(_approval_result(1, {}), _action(), approval_ttl_ms=1)
    second = escalation_for(_approval_result(2, {}), _action(), approval_ttl_ms=1)
    assert first is not None
    assert again is not None
    assert second is not None
    assert first == again
    assert first.escalation_id != second.escalation_id


def test_an_oversize_prompt_is_replaced_not_copied() -> None:
    prompt = {"description": "x" * (MAX_PROMPT_BYTES + 1)}
    escalation = escalation_for(_approval_result(1, prompt), _action(), approval_ttl_ms=1)
    assert escalation is not None
    assert escalation.approval is not None
    assert "x" * 100 not in msgspec.json.encode(escalation).decode()


@pytest.mark.parametrize(
    ("status", "error", "escalates"),
    [
        (ResultStatus.COMPLETED, None, False),
        (ResultStatus.FAILED, ConnectorError(ErrorCode.OPERATOR_FAILED, "failed"), False),
        (ResultStatus.FAILED, ConnectorError(ErrorCode.OPERATOR_OUTCOME_UNKNOWN, "?"), True),
        (ResultStatus.FAILED, ConnectorError(ErrorCode.CANCELLATION_OUTCOME_UNKNOWN, "?"), True),
        (ResultStatus.FAILED, ConnectorError(ErrorCode.DELEGATED_RESULT_INTEGRITY, "!"), True),
        (
            ResultStatus.FAILED,
            ConnectorError(ErrorCode.TRANSPORT, "t", uncertain_outcome=False),
            False,
        ),
        (
            ResultStatus.FAILED,
            ConnectorError(ErrorCode.TRANSPORT, "t", uncertain_outcome=True),
            True,
        ),
    ],
)
def test_only_states_a_human_must_decide_escalate(
    status: ResultStatus, error: ConnectorError | None, escalates: bool
) -> None:
    escalation = escalation_for(_result(status, error), _action(), approval_ttl_ms=1)
    assert (escalation is not None) is escalates
    if escalation is not None:
        assert escalation.kind is EscalationKind.DECISION
        assert escalation.approval is None
        assert escalation.deadline_unix_ms is None
        assert error is not None
        assert escalation.code is error.code
        assert ESCALATE[error.code].need in (Need.ALWAYS, Need.UNCERTAIN)
