"""Approval quorum through live workers (real NATS, Redis, worker processes, the fake
Hermes): the authority file requires two distinct members for the operator capability.

Nothing reaches Hermes until two members hold live, signed approvals; the same member
twice counts once; one denial ends the Action; an AIP `ApprovalDecision` carried in the
Action is checked against the records and never believed on its own. `escalations resolve`
answers a paused run only once the quorum approved the resume, and one member's `deny`
resolves it as rejected.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from schemas.escalation import EscalationResolution, ResumeClaim
from schemas.result import ActionResult, ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_escalations import cli, escalations
from worker.commands.exit_codes import Exit
from worker.errors import ApprovalRefused
from worker.store.approvals import read_records
from worker.store.keys import escalation_resume_key
from worker.testing.identities import APPROVER_UNTENANTED, authority_memberships
from worker.testing.scenario import NEEDS_APPROVAL

POST_RUNS = "POST /v1/runs"
APPROVAL_POST = "POST /v1/runs/{run_id}/approval"
UNAVAILABLE = "connector_host.approval_authorization_unavailable"
CONFLICT = "connector_host.approval_authorization_conflict"
SECOND = "approver:erin"
THIRD = "approver:frank"


@pytest.fixture
def authority() -> list[dict[str, Any]]:
    extra = [
        {
            "principal_id": who,
            "revision": 1,
            "tenant_id": None,
            "capability_prefixes": ["cap:hermes_agent:"],
        }
        for who in (SECOND, THIRD)
    ]
    return [*authority_memberships(), *extra]


@pytest.fixture
def quorums() -> list[dict[str, Any]]:
    return [{"capability_prefix": f"cap:hermes_agent:{ENDPOINT}:operator", "required": 2}]


def _count(stack: Stack, what: str) -> int:
    assert stack.fake is not None
    return stack.fake.stats().count(what)


def _refused(result: ActionResult, code: str) -> str:
    assert result.status is ResultStatus.FAILED, result
    assert result.error is not None
    assert (result.error.code, result.error.retryable) == (code, False)
    return result.error.message


async def test_one_approval_of_a_quorum_of_two_sends_nothing(stack: Stack) -> None:
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "one approver is not enough"})
    recorded = await stack.approve(action)
    assert (recorded.approvals, recorded.required) == (1, 2)
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert "1 of 2 approvals" in _refused(result, UNAVAILABLE)
    assert _count(stack, POST_RUNS) == 0


async def test_two_distinct_members_run_it_once_carrying_an_aip_decision(stack: Stack) -> None:
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "two approvers agree"})
    await stack.approve(action)
    second = await stack.approve(action, approver=SECOND)
    assert (second.approvals, second.required) == (2, 2)
    # A third member's approval after the quorum is met is refused: nothing is contradicted.
    with pytest.raises(ApprovalRefused, match="2 of 2 approvals"):
        await stack.approve(action, approver=THIRD)
    # The Action carries the second member's ApprovalDecision, as `approve` printed it.
    carried = msgspec.structs.replace(action, approval=second.view)
    handle = await stack.publish(carried)
    await stack.publish(carried)  # a second copy: deduplicated, never a second run
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    await stack.settled_and_acked(timeout_s=30)
    assert _count(stack, POST_RUNS) == 1
    assert len(await stack.results(action.id)) == 1


async def test_the_same_member_twice_is_not_a_quorum(stack: Stack) -> None:
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "one approver, twice"})
    await stack.approve(action)
    with pytest.raises(ApprovalRefused, match="counts once"):
        await stack.approve(action)
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert "1 of 2 approvals" in _refused(result, UNAVAILABLE)
    assert _count(stack, POST_RUNS) == 0


async def test_one_denial_ends_it(stack: Stack) -> None:
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "one member says no"})
    await stack.approve(action)
    await stack.approve(action, approver=SECOND, deny=True)
    with pytest.raises(ApprovalRefused, match="denial is final"):
        await stack.approve(action, approver=THIRD)
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert "denied this Action" in _refused(result, CONFLICT)
    assert _count(stack, POST_RUNS) == 0


async def test_a_forged_approval_decision_without_a_record_is_refused(stack: Stack) -> None:
    """An Envelope edited by the AIP rules (not the project's codec) to carry a
    schema-valid approved ApprovalDecision, and signed by the trusted gateway key: no
    record stands behind it, so it grants nothing."""
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "approved, says the payload"})
    document = stack.envelope_document(action)
    document["body"]["action"]["approval"] = {
        "approval_id": "appr_" + action.id.removeprefix("act_"),
        "decision": "approved",
        "approver": {"id": APPROVER_UNTENANTED, "kind": "human"},
        "decided_at": "2026-01-01T00:00:00Z",
        "decision_id": "apr_" + "7" * 32,
    }
    result = await (await stack.publish_envelope(stack.sign_document(document))).result(
        timeout_s=30
    )
    assert "no decision is recorded" in _refused(result, CONFLICT)
    assert _count(stack, POST_RUNS) == 0


async def _paused(stack: Stack, objective: str) -> str:
    """An operator run paused on Hermes' approval request; its escalation id."""
    source = stack.action("operator", {"objective": f"{NEEDS_APPROVAL} {objective}"})
    await stack.approve(source)
    await stack.approve(source, approver=SECOND)
    paused = await (await stack.publish(source)).result(timeout_s=60)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    [escalation] = await escalations(stack)
    return escalation.escalation_id


async def _resolve(stack: Stack, escalation_id: str, who: str, choice: str) -> tuple[int, str, str]:
    return await cli(
        stack, "escalations", "resolve", escalation_id, "--endpoint", ENDPOINT,
        "--reason", f"{who} checked it", "--as", who,
        "--key", str(stack.trust.approver_seed_files[who]),
        "--choice", choice, "--sign-key", str(stack.trust.seed_file),
    )  # fmt: skip


async def test_escalations_resolve_resumes_only_once_the_quorum_approved(stack: Stack) -> None:
    await stack.spawn("w1")
    escalation_id = await _paused(stack, "tidy the files")

    code, out, err = await _resolve(stack, escalation_id, APPROVER_UNTENANTED, "once")
    assert code == 0, err
    assert msgspec.json.decode(out) == {
        "escalation_id": escalation_id, "approvals": 1, "required": 2
    }  # fmt: skip
    assert "1 of 2 approvals" in err
    # The same member again: still one of two, and Hermes has heard nothing.
    code, out, err = await _resolve(stack, escalation_id, APPROVER_UNTENANTED, "once")
    assert (code, msgspec.json.decode(out)["approvals"]) == (0, 1), err
    # Another approving answer than the opened one is refused.
    code, _, err = await _resolve(stack, escalation_id, SECOND, "always")
    assert code == Exit.REFUSED, err
    assert _count(stack, APPROVAL_POST) == 0

    code, out, err = await _resolve(stack, escalation_id, SECOND, "once")
    assert code == 0, err
    resolution = msgspec.json.decode(out, type=EscalationResolution)
    assert resolution.resume_action_id is not None
    assert resolution.resolved_by == SECOND
    resumed = await stack.client.handle(ENDPOINT, resolution.resume_action_id).result(
        timeout_s=60
    )
    assert resumed.status is ResultStatus.COMPLETED, resumed.error
    await stack.settled_and_acked(timeout_s=30)
    assert _count(stack, APPROVAL_POST) == 1


async def test_one_members_deny_resolves_the_escalation_as_rejected(stack: Stack) -> None:
    await stack.spawn("w1")
    escalation_id = await _paused(stack, "delete the backups")
    code, _, err = await _resolve(stack, escalation_id, APPROVER_UNTENANTED, "once")
    assert code == 0, err

    code, out, err = await _resolve(stack, escalation_id, SECOND, "deny")
    assert code == 0, err
    resolution = msgspec.json.decode(out, type=EscalationResolution)
    assert resolution.choice is not None
    assert resolution.choice.value == "deny"
    assert resolution.resume_action_id is not None
    # The resume the first member opened (and approved) is denied for good.
    client = Redis.from_url(stack.redis_url)
    try:
        raw = await client.get(escalation_resume_key(escalation_id))
        assert raw is not None
        opened = msgspec.json.decode(raw, type=ResumeClaim)
        decisions = await read_records(client, opened.resume_action_id)
    finally:
        await client.aclose()
    assert opened.resume_action_id != resolution.resume_action_id
    assert sorted((r.approver_principal_id, r.decision.value) for r in decisions) == [
        (APPROVER_UNTENANTED, "approved"), (SECOND, "denied")
    ]  # fmt: skip
    # The approving answer can no longer gather its quorum: the escalation is answered.
    code, _, err = await _resolve(stack, escalation_id, THIRD, "once")
    assert code == Exit.REFUSED, err
    assert "already resolved" in err
    denied = await stack.client.handle(ENDPOINT, resolution.resume_action_id).result(
        timeout_s=60
    )
    assert denied.status is ResultStatus.COMPLETED, denied.error
    await stack.settled_and_acked(timeout_s=30)
    assert _count(stack, APPROVAL_POST) == 1  # Hermes was told "deny", once
