"""Nobody reads or steers what is not theirs (issue 24, items 3 and 5), replayed against real
worker processes, NATS, Redis and the fake Hermes (faithful to Hermes 0.19.0).

Each test is an attack from the compose-shaped deployment's attack pass: one Hermes bound to
no tenant serving tenant-a and tenant-b principals.

* a tenant-b principal (with a tenant-b approver) resumes a tenant-a run waiting on a
  command: refused, Hermes receives no approval answer; the run's own principal still can;
* another principal publishes an approved Action's id, capability and input as its own:
  the approval does not admit it, nothing reaches Hermes;
* the resume id `escalations resolve` used to derive from the (public) escalation id is
  published first by someone else: the real answer still reaches the run;
* a tenant-b principal lists and reads sessions, messages, operator sessions, jobs, runs and
  stored responses of tenant a on a shared endpoint: it sees none of them;
* an Action carrying a tenant on an unbound endpoint not configured shared: refused, nothing
  sent to Hermes.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from schemas.action import Action
from schemas.escalation import EscalationKind, EscalationResolution
from schemas.result import ActionResult, ResultStatus
from tests.integration.stack import ENDPOINT, Stack, fake_stack
from tests.integration.test_escalations import escalations, resolve_as_approver
from worker.testing.identities import (
    APPROVER_A,
    APPROVER_B,
    APPROVER_UNTENANTED,
    TENANT_A,
    TENANT_B,
    USER_A,
    USER_B,
    USER_UNTENANTED,
    authority_memberships,
    identity_entries,
    write_trust_files,
)
from worker.testing.scenario import NEEDS_APPROVAL
from worker.testing.services import ServiceHandle

APPROVAL_POST = "POST /v1/runs/{run_id}/approval"
CONFLICT = "connector_host.approval_authorization_conflict"
TENANT_MISMATCH = "connector.hermes_agent.tenant_mismatch"
#: A second principal of tenant a that approves nothing: the one that tries to use another's
#: approval.
MALLORY = "user:mallory"
#: A second approver of tenant a, so that the first can resume as an authority member.
APPROVER_A2 = "approver:erin"
SHARED = {"AIPD_HERMES_SHARED_ENDPOINTS": ENDPOINT}


@pytest.fixture
async def stack(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> AsyncIterator[Stack]:
    """The usual stack, its directory holding one more tenant-a principal (`MALLORY`) and
    its authority one more tenant-a approver (`APPROVER_A2`)."""
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    mallory = {**identity_entries()[0], "principal_id": MALLORY}
    erin = {**authority_memberships()[0], "principal_id": APPROVER_A2}
    trust = write_trust_files(
        trust_dir,
        identities=[*identity_entries(), mallory],
        memberships=[*authority_memberships(), erin],
    )
    async with fake_stack(
        tmp_path, nats_server.url, redis_server.url, trust, lease_ttl_ms=3000
    ) as stack:
        yield stack


def partition(tenant: str) -> str:
    """The documented id prefix of a tenant's partition (docs/security.md)."""
    return "t" + hashlib.sha256(f"tenant:{tenant}".encode()).hexdigest()[:12] + "-"


def as_(stack: Stack, principal: str, tenant: str | None, operation: str, **input: Any) -> Action:
    return stack.action(operation, input, principal_id=principal, tenant_id=tenant)


async def run(
    stack: Stack, action: Action, *, approver: str | None = None, timeout_s: float = 30
) -> ActionResult:
    if approver is not None:
        await stack.approve(action, approver=approver)
    return await (await stack.publish(action)).result(timeout_s=timeout_s)


def refused(result: ActionResult, code: str) -> None:
    assert result.status is ResultStatus.FAILED, result
    assert result.error is not None
    assert result.error.code == code, result.error


async def waiting_run(stack: Stack, principal: str, tenant: str | None, approver: str) -> Action:
    """An operator run of `principal` paused on a command Hermes holds for approval."""
    source = as_(stack, principal, tenant, "operator", objective=f"{NEEDS_APPROVAL} tidy up")
    paused = await run(stack, source, approver=approver, timeout_s=60)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    return source


def resume(stack: Stack, source: Action, principal: str, tenant: str | None, choice: str) -> Action:
    return as_(
        stack,
        principal,
        tenant,
        "operator",
        resume={"source_action_id": source.id, "choice": choice},
    )


@pytest.mark.aip_family("approval_lifecycle", assertions=["authority_verified"])
async def test_a_tenant_b_principal_cannot_resume_a_tenant_a_run(stack: Stack) -> None:
    await stack.spawn("w1", **SHARED)
    source = await waiting_run(stack, USER_A, TENANT_A, APPROVER_A)
    assert stack.fake is not None

    # Bob, with his own tenant's approver, answers Alice's prompt with `always`.
    hostile = await run(
        stack, resume(stack, source, USER_B, TENANT_B, "always"), approver=APPROVER_B
    )
    refused(hostile, CONFLICT)
    assert "resume" in hostile.error.message  # type: ignore[union-attr]
    assert stack.fake.stats().count(APPROVAL_POST) == 0

    # The run still waits, and its own principal answers it.
    own = await run(
        stack, resume(stack, source, USER_A, TENANT_A, "once"), approver=APPROVER_A, timeout_s=60
    )
    assert own.status is ResultStatus.COMPLETED, own.error
    assert stack.fake.stats().count(APPROVAL_POST) == 1


async def test_an_authority_member_of_the_runs_tenant_may_resume_it(stack: Stack) -> None:
    await stack.spawn("w1", **SHARED)
    source = await waiting_run(stack, USER_A, TENANT_A, APPROVER_A)
    assert stack.fake is not None
    # Carol holds an approval membership for tenant a: she may answer Alice's run (Erin,
    # another tenant-a approver, approves her resume: nobody approves their own Action).
    answered = await run(
        stack,
        resume(stack, source, APPROVER_A, TENANT_A, "once"),
        approver=APPROVER_A2,
        timeout_s=60,
    )
    assert answered.status is ResultStatus.COMPLETED, answered.error
    assert stack.fake.stats().count(APPROVAL_POST) == 1


async def test_another_principal_cannot_consume_someone_elses_approval(stack: Stack) -> None:
    await stack.spawn("w1", **SHARED)
    assert stack.fake is not None
    prompt = {"name": partition(TENANT_A) + "nightly", "schedule": "every 30m", "prompt": "hi"}
    alice = as_(stack, USER_A, TENANT_A, "job_create", **prompt)
    await stack.approve(alice, approver=APPROVER_A)

    # Mallory (same tenant) publishes Alice's approved id, capability and input as hers.
    mallory = stack.client.build_action(
        endpoint_id=ENDPOINT,
        operation="job_create",
        input=prompt,
        principal_id=MALLORY,
        tenant_id=TENANT_A,
        principal_kind="user",
        authentication_issuer="https://idp.example.test",
        credential_revision=3,
        action_id=alice.id,
    )
    result = await (await stack.publish(mallory)).result(timeout_s=30)
    refused(result, CONFLICT)
    assert "another principal" in result.error.message  # type: ignore[union-attr]
    assert stack.fake.stats().count("POST /api/jobs") == 0


async def test_a_resume_id_burned_first_does_not_stop_the_real_answer(stack: Stack) -> None:
    await stack.spawn("w1")
    source = await waiting_run(stack, USER_UNTENANTED, None, APPROVER_UNTENANTED)
    assert stack.fake is not None
    raised = [e for e in await escalations(stack) if e.action_id == source.id]
    assert len(raised) == 1
    assert raised[0].kind is EscalationKind.APPROVAL
    escalation = raised[0]

    # Anyone who reads the escalation stream could publish under the id derived from it.
    derived = "act_" + hashlib.sha256(f"resume:{escalation.escalation_id}".encode()).hexdigest()
    burner = stack.client.build_action(
        endpoint_id=ENDPOINT,
        operation="models",
        input={},
        principal_id=USER_UNTENANTED,
        principal_kind="user",
        authentication_issuer="https://idp.example.test",
        credential_revision=3,
        action_id=derived[:36],
    )
    burned = await (await stack.publish(burner)).result(timeout_s=30)
    assert burned.status is ResultStatus.COMPLETED, burned.error

    code, out, err = await resolve_as_approver(stack, escalation.escalation_id)
    assert code == 0, err
    resolution = msgspec.json.decode(out, type=EscalationResolution)
    assert resolution.resume_action_id is not None
    assert resolution.resume_action_id != burner.id
    resumed = await stack.client.handle(ENDPOINT, resolution.resume_action_id).result(timeout_s=60)
    assert resumed.status is ResultStatus.COMPLETED, resumed.error
    assert stack.fake.stats().count(APPROVAL_POST) == 1


@pytest.mark.aip_family("identity_credentials", assertions=["tenant_isolated"])
async def test_tenant_b_sees_none_of_tenant_a_on_a_shared_endpoint(stack: Stack) -> None:
    await stack.spawn("w1", **SHARED)
    assert stack.fake is not None
    a = partition(TENANT_A)

    # Tenant a's data: a named session with a secret in it, one Hermes named for it, a job,
    # a stored response, and an operator run (its session) waiting for approval.
    secret = "my IBAN is DE89 3704 0044 0532 0130 00"
    named = await run(stack, as_(stack, USER_A, TENANT_A, "session_create", id=a + "salary"))
    assert named.status is ResultStatus.COMPLETED, named.error
    chat = await run(
        stack,
        as_(stack, USER_A, TENANT_A, "session_chat", session_id=a + "salary", message=secret),
    )
    assert chat.status is ResultStatus.COMPLETED, chat.error
    minted = await run(stack, as_(stack, USER_A, TENANT_A, "session_create"))
    assert minted.status is ResultStatus.COMPLETED, minted.error
    minted_id = minted.output["session"]["id"]
    job = await run(
        stack,
        as_(stack, USER_A, TENANT_A, "job_create", name=a + "payroll", schedule="every 30m"),
        approver=APPROVER_A,
    )
    assert job.status is ResultStatus.COMPLETED, job.error
    job_id = job.output["job"]["id"]
    response = await run(stack, as_(stack, USER_A, TENANT_A, "responses", input=secret))
    assert response.status is ResultStatus.COMPLETED, response.error
    response_id = response.output["id"]
    operator = await waiting_run(stack, USER_A, TENANT_A, APPROVER_A)
    run_id = await stack.wait_bound(operator.id)
    a_sessions = {a + "salary", minted_id}

    # Tenant a sees its own.
    own = await run(stack, as_(stack, USER_A, TENANT_A, "sessions_list"))
    assert own.status is ResultStatus.COMPLETED, own.error
    assert a_sessions <= {row["id"] for row in own.output["data"]}

    # Tenant b lists: none of tenant a's rows.
    listed = await run(stack, as_(stack, USER_B, TENANT_B, "sessions_list", limit=200))
    assert listed.status is ResultStatus.COMPLETED, listed.error
    assert listed.output["data"] == [], listed.output
    jobs = await run(stack, as_(stack, USER_B, TENANT_B, "jobs_list", include_disabled=True))
    assert jobs.status is ResultStatus.COMPLETED, jobs.error
    assert jobs.output["jobs"] == [], jobs.output

    # Tenant b reads by id: refused, whatever name it tries for the operator's session.
    before = stack.fake.stats()
    operator_sessions = [f"aip-operator-{operator.id}", f"{a}aip-operator-{operator.id}"]
    for session_id in [*a_sessions, *operator_sessions]:
        for operation in ("session_get", "session_messages"):
            read = await run(stack, as_(stack, USER_B, TENANT_B, operation, session_id=session_id))
            refused(read, TENANT_MISMATCH)
            assert secret not in msgspec.json.encode(read).decode()
    assert stack.fake.stats().count("GET /api/sessions/{session_id}") == before.count(
        "GET /api/sessions/{session_id}"
    )
    assert stack.fake.stats().count("GET /api/sessions/{session_id}/messages") == before.count(
        "GET /api/sessions/{session_id}/messages"
    )
    refused(
        await run(stack, as_(stack, USER_B, TENANT_B, "job_get", job_id=job_id)), TENANT_MISMATCH
    )
    refused(
        await run(stack, as_(stack, USER_B, TENANT_B, "response_get", response_id=response_id)),
        TENANT_MISMATCH,
    )
    refused(
        await run(stack, as_(stack, USER_B, TENANT_B, "run_status", run_id=run_id)),
        TENANT_MISMATCH,
    )
    # Chaining onto tenant a's stored response is a read of it too.
    chained = as_(
        stack, USER_B, TENANT_B, "responses", input="go on", previous_response_id=response_id
    )
    refused(await run(stack, chained), TENANT_MISMATCH)

    # Tenant a still reads its own by id.
    mine = await run(
        stack, as_(stack, USER_A, TENANT_A, "session_messages", session_id=a + "salary")
    )
    assert mine.status is ResultStatus.COMPLETED, mine.error
    assert secret in msgspec.json.encode(mine.output).decode()
    own_response = await run(
        stack, as_(stack, USER_A, TENANT_A, "response_get", response_id=response_id)
    )
    assert own_response.status is ResultStatus.COMPLETED, own_response.error


@pytest.mark.aip_family("identity_credentials", assertions=["tenant_isolated"])
async def test_a_tenant_action_on_an_unbound_unshared_endpoint_is_refused(stack: Stack) -> None:
    await stack.spawn("w1")  # h1 is bound to no tenant and not configured shared
    assert stack.fake is not None
    routes = ("GET /api/sessions", "POST /api/sessions", "GET /v1/models")
    before = [stack.fake.stats().count(route) for route in routes]
    for operation, input in (
        ("sessions_list", {}),
        ("session_create", {"id": partition(TENANT_A) + "x"}),
        ("models", {}),
    ):
        result = await run(stack, as_(stack, USER_A, TENANT_A, operation, **input))
        refused(result, TENANT_MISMATCH)
        assert "not configured shared" in result.error.message  # type: ignore[union-attr]
    # An Action without a tenant is still served there.
    served = await run(stack, as_(stack, USER_UNTENANTED, None, "models"))
    assert served.status is ResultStatus.COMPLETED, served.error
    after = [stack.fake.stats().count(route) for route in routes]
    assert [n - b for n, b in zip(after, before, strict=True)] == [0, 0, 1]
