"""First-class delegation end to end: worker processes, real NATS and Redis, the fake Hermes
calling `aip_call` over MCP on the real AIP gateway, which records the child in its queue and
lifecycle streams, dispatches it to the echo capability on the bus and settles it. The result
is the verified native child result, never Hermes' prose, and one delegation means at most one
Hermes run. Broken invariants come from a test wrapper around the gateway's store writer."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from schemas.chunk import DoneChunk, ToolChunk
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.delegation import delegation_action_id
from worker.delegation.payload import aip_call_arguments
from worker.store.clock import now_ms
from worker.testing.runtime_faults import RuntimeFault
from worker.wire.actions import GATEWAY_SENDER
from worker.wire.delegations import encode_delegation

from .conftest import DelegationStack

POST_RUNS = "POST /v1/runs"
PREFIX = "connector.hermes_agent."


async def settled_count(dstack: DelegationStack, action_id: str) -> int:
    """Fenced settles recorded for an Action (a double settle would show here, while the
    results stream's duplicate window would hide a second publish)."""
    receipts = await dstack.stack.client.receipts("h1", action_id)
    return sum(1 for r in receipts if r.event.value == "settled")


async def test_the_result_is_the_verified_native_child_result(dstack: DelegationStack) -> None:
    await dstack.stack.spawn("w1")
    request = dstack.request()
    handle = await dstack.delegate(request)
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.action_id == delegation_action_id(request.delegation_id)
    output = result.output
    assert output["delegation_id"] == request.delegation_id
    assert output["child_action_id"] == request.action.id
    child = output["delegation_result"]["result"]
    assert child["action_id"] == request.action.id
    echoed = {"echo": request.action.input, "capability": request.action.capability}
    assert child["output"] == echoed
    # Hermes' own final text is kept as operator evidence, never as the business result.
    assert output["operator"]["status"] == "completed"
    assert output["operator"]["delegation_id"] == request.delegation_id
    assert "I called aip_call" in output["operator"]["provider"]["output"]
    assert "I called aip_call" not in msgspec.json.encode(child).decode()
    # Hermes received the exact arguments, without identity, and called the tool once.
    assert dstack.runtime.calls == [aip_call_arguments(request.action)]
    assert dstack.fake.stats().count(POST_RUNS) == 1
    chunks = [c async for c in handle.chunks(idle_timeout_s=10)]
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert any(isinstance(c, ToolChunk) for c in chunks)
    assert isinstance(chunks[-1], DoneChunk)


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        (RuntimeFault.NOT_CREATED, "delegated_execution_not_observed"),
        (RuntimeFault.REPLACED_ACTION_ID, "delegated_execution_not_observed"),
        (RuntimeFault.ALTERED_INPUT, "delegated_action_contract_mismatch"),
        (RuntimeFault.FORGED_OWNER, "delegated_identity_mismatch"),
        (RuntimeFault.IDENTITY_INTEGRITY, "delegated_identity_integrity"),
        (RuntimeFault.NO_WRITE_SCOPE, "delegated_identity_unverified"),
        (RuntimeFault.TENANT_DRIFT, "delegated_tenant_mismatch"),
        (RuntimeFault.STORES_DISAGREE, "delegated_result_integrity"),
        (RuntimeFault.NO_RESULT, "delegated_result_integrity"),
        (RuntimeFault.UNSIGNED, "delegated_result_integrity"),
    ],
)
async def test_a_broken_invariant_fails_closed_with_its_code(
    dstack: DelegationStack, fault: RuntimeFault, code: str
) -> None:
    await dstack.stack.spawn("w1")
    dstack.runtime.fault = fault
    request = dstack.request()
    result = await (await dstack.delegate(request)).result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == PREFIX + code, result.error
    assert result.error.retryable is False
    assert "result" not in result.output["delegation_result"]
    assert dstack.fake.stats().count(POST_RUNS) == 1


async def test_trusted_memory_enrichment_still_verifies(dstack: DelegationStack) -> None:
    await dstack.stack.spawn("w1")
    dstack.runtime.fault = RuntimeFault.MEMORY_ENRICHED
    result = await (await dstack.delegate(dstack.request())).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error


async def test_a_child_that_never_settles_is_not_ready_by_the_deadline(
    dstack: DelegationStack,
) -> None:
    await dstack.stack.spawn("w1")
    dstack.runtime.fault = RuntimeFault.NEVER_SETTLES
    request = dstack.request(deadline_s=6.0)
    result = await (await dstack.delegate(request)).result(timeout_s=30)
    assert result.error is not None
    assert result.error.code == ErrorCode.DELEGATED_RESULT_NOT_READY
    assert result.error.retryable is True
    assert dstack.fake.stats().count(POST_RUNS) == 1


async def test_without_the_runtime_stores_the_resolver_is_missing(
    dstack: DelegationStack,
) -> None:
    js = dstack.stack.nc.jetstream()
    for kind in ("queue", "lifecycle"):
        await js.delete_stream(dstack.stack.subjects.runtime_stream_name(kind))
    await dstack.stack.spawn("w1")
    result = await (await dstack.delegate(dstack.request())).result(timeout_s=30)
    assert result.error is not None
    assert result.error.code == ErrorCode.DELEGATED_RESULT_RESOLVER_MISSING
    # Checked before the start: a child whose result cannot be read never runs.
    assert dstack.fake.stats().count(POST_RUNS) == 0


async def test_concurrent_duplicate_deliveries_start_one_run(dstack: DelegationStack) -> None:
    for n in range(2):
        await dstack.stack.spawn(f"w{n}")
    request = dstack.request()
    handle = await dstack.delegate(request)
    await asyncio.gather(
        *(dstack.delegate(request, approve=False, dedupe=False) for _ in range(19))
    )
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    await asyncio.sleep(2.0)
    assert dstack.fake.stats().count(POST_RUNS) == 1
    assert len(dstack.runtime.calls) == 1
    assert await settled_count(dstack, handle.action_id) == 1


@pytest.mark.parametrize("point", ["after_post_run", "after_bind", "before_resolve"])
async def test_a_killed_owner_is_replaced_without_a_second_start(
    dstack: DelegationStack, point: str
) -> None:
    request = dstack.request()
    action_id = delegation_action_id(request.delegation_id)
    w1 = await dstack.stack.spawn("w1", fault_points=f"{point}=exit@{action_id}")
    handle = await dstack.delegate(request)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    await dstack.stack.spawn("w2")
    result = await handle.result(timeout_s=60)
    posts = dstack.fake.stats().count(POST_RUNS)
    assert posts == 1
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.output["delegation_result"]["result"]["action_id"] == request.action.id
    assert result.settled_by == "w2"
    if point == "after_post_run":
        # The run id was never bound: the run is unknown and never replayed, but the child
        # it created is observed and verified, so it is the business result.
        assert result.output["operator"]["status"] == "outcome_unknown"
        assert result.output["operator"]["run_id"] is None
    assert len(dstack.runtime.calls) == 1
    assert await settled_count(dstack, action_id) == 1
    chunks = await dstack.stack.chunks(action_id)
    assert [c.seq for c in chunks] == list(range(len(chunks)))


async def test_disabled_delegation_is_settled_once_as_a_policy_refusal(
    dstack: DelegationStack,
) -> None:
    await dstack.stack.spawn("w1", AIPD_HERMES_OPERATOR_DELEGATION_ENABLED="false")
    result = await (await dstack.delegate(dstack.request())).result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == PREFIX + "operator_policy"
    assert "disabled" in result.error.message
    assert dstack.fake.stats().count(POST_RUNS) == 0


async def test_a_child_outside_the_allowlist_is_refused_before_hermes(
    dstack: DelegationStack,
) -> None:
    await dstack.stack.spawn("w1")
    request = dstack.request(capability="cap:billing:invoice.pay")
    result = await (await dstack.delegate(request, approve=False)).result(timeout_s=30)
    assert result.error is not None
    assert result.error.code == PREFIX + "operator_policy"
    assert dstack.fake.stats().count(POST_RUNS) == 0


async def test_the_child_needs_a_durable_approval(dstack: DelegationStack) -> None:
    await dstack.stack.spawn("w1")
    result = await (await dstack.delegate(dstack.request(), approve=False)).result(timeout_s=30)
    assert result.error is not None
    assert result.error.code == "connector_host.approval_authorization_unavailable"
    assert dstack.fake.stats().count(POST_RUNS) == 0
    assert dstack.runtime.calls == []


async def test_an_exempt_child_prefix_skips_only_the_connector_approval(
    dstack: DelegationStack,
) -> None:
    await dstack.stack.spawn(
        "w1",
        AIPD_HERMES_OPERATOR_DELEGATION_APPROVAL_EXEMPT_PREFIXES="cap:support_sandbox:case.get",
    )
    result = await (await dstack.delegate(dstack.request(), approve=False)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error


async def test_unsigned_and_malformed_requests_are_dead_lettered(dstack: DelegationStack) -> None:
    await dstack.stack.spawn("w1")
    js = dstack.stack.nc.jetstream()
    subject = dstack.stack.subjects.delegations("h1")
    request = dstack.request()
    unsigned = encode_delegation(request, signer=None, sender=GATEWAY_SENDER)
    await js.publish(subject, unsigned, headers={"Nats-Msg-Id": "unsigned"})
    await js.publish(subject, b'{"delegation_id": 1}', headers={"Nats-Msg-Id": "bad"})
    for _ in range(100):
        if len(await dstack.stack.dlq()) >= 2:
            break
        await asyncio.sleep(0.1)
    codes = sorted(headers.get("code", "") for _, headers in await dstack.stack.dlq())
    assert codes == ["connector_host.authentication", "schema.envelope.invalid"], codes
    assert dstack.fake.stats().count(POST_RUNS) == 0


async def test_a_delegation_under_another_msg_id_is_refused_and_admitted_ones_say_who(
    dstack: DelegationStack,
) -> None:
    await dstack.stack.spawn("w1")
    squatter = dstack.request()
    victim = dstack.request()
    payload = dstack.stack.client.seal_delegation(squatter)
    headers = {"Nats-Msg-Id": delegation_action_id(victim.delegation_id)}
    await dstack.stack.nc.jetstream().publish(
        dstack.stack.subjects.delegations("h1"), payload, headers=headers
    )
    for _ in range(100):
        if await dstack.stack.dlq():
            break
        await asyncio.sleep(0.1)
    [(_, dead)] = await dstack.stack.dlq()
    assert dead["code"] == "connector_host.replay"
    assert dstack.fake.stats().count(POST_RUNS) == 0
    # The victim itself: its content-bound `Nats-Msg-Id` is not the squatted one, so the
    # server stores it and it runs (issue 27: nobody pre-empts an id without its bytes).
    handle = await dstack.delegate(victim)
    assert not handle.duplicate
    assert (await handle.result(timeout_s=30)).status is ResultStatus.COMPLETED
    await asyncio.sleep(1.0)
    receipts = await dstack.stack.client.receipts("h1", handle.action_id)
    [admitted] = [r for r in receipts if r.event.value == "admitted"]
    assert admitted.details["principal_id"]
    assert "approval_decision_id" in admitted.details


async def test_reusing_a_delegation_id_with_another_child_collides(
    dstack: DelegationStack,
) -> None:
    # Exempt from the child approval, so the changed child passes admission and reaches
    # the idempotency fence itself.
    await dstack.stack.spawn(
        "w1", AIPD_HERMES_OPERATOR_DELEGATION_APPROVAL_EXEMPT_PREFIXES="cap:support_sandbox:"
    )
    request = dstack.request()
    first = await (await dstack.delegate(request)).result(timeout_s=30)
    assert first.status is ResultStatus.COMPLETED, first.error
    changed = msgspec.structs.replace(
        request, action=msgspec.structs.replace(request.action, input={"case_id": "other"})
    )
    await dstack.delegate(changed, approve=False, dedupe=False)
    for _ in range(100):
        if await dstack.stack.dlq():
            break
        await asyncio.sleep(0.1)
    (_, headers), = await dstack.stack.dlq()
    assert headers["code"] == PREFIX + "operator_policy"
    assert dstack.fake.stats().count(POST_RUNS) == 1
    assert await settled_count(dstack, delegation_action_id(request.delegation_id)) == 1


async def test_a_delegation_cancelled_before_delivery_starts_nothing(
    dstack: DelegationStack,
) -> None:
    await dstack.stack.spawn("w1")
    request = dstack.request()
    action_id = delegation_action_id(request.delegation_id)
    reply = await dstack.stack.client.cancel(
        "h1", action_id, reason="not needed", requested_by="user:demo"
    )
    assert reply.accepted
    result = await (await dstack.delegate(request)).result(timeout_s=30)
    assert result.status is ResultStatus.CANCELLED, result.error
    assert "result" not in result.output["delegation_result"]
    assert dstack.fake.stats().count(POST_RUNS) == 0
    assert dstack.runtime.calls == []


async def test_a_redelivery_after_the_deadline_resolves_what_exists(
    dstack: DelegationStack,
) -> None:
    # The first owner dies after binding the run; by the time another worker gets the
    # delegation its deadline has passed. Admission now refuses a *start*, but the run and
    # its child exist: they are observed and resolved, never settled as "nothing started".
    request = dstack.request()
    action_id = delegation_action_id(request.delegation_id)
    w1 = await dstack.stack.spawn("w1", fault_points=f"after_bind=exit@{action_id}")
    # The deadline counts from a ready worker: starting one takes seconds on a loaded machine,
    # and a deadline that passes before w1 is up tests nothing.
    request = msgspec.structs.replace(request, deadline_unix_ms=now_ms() + 4_000)
    handle = await dstack.delegate(request)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    await asyncio.sleep(4.5)
    await dstack.stack.spawn("w2")
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.output["delegation_result"]["result"]["action_id"] == request.action.id
    assert result.settled_by == "w2"
    assert dstack.fake.stats().count(POST_RUNS) == 1
    assert len(dstack.runtime.calls) == 1


async def test_the_delegator_cannot_approve_its_own_child(dstack: DelegationStack) -> None:
    from worker.testing.identities import APPROVER_UNTENANTED

    await dstack.stack.spawn("w1")
    # The demo approver delegates, then approves the child itself.
    request = dstack.request(delegator=APPROVER_UNTENANTED)
    result = await (await dstack.delegate(request)).result(timeout_s=30)
    assert result.error is not None
    assert result.error.code == "connector_host.approval_authorization_conflict"
    assert "delegator" in result.error.message
    assert dstack.fake.stats().count(POST_RUNS) == 0


async def test_a_tenanted_delegation_verifies_its_tenant_end_to_end(
    dstack: DelegationStack,
) -> None:
    from worker.testing.identities import APPROVER_A, TENANT_A, USER_A

    # h1 serves two tenants' principals: configured shared, as an administrator must.
    await dstack.stack.spawn("w1", AIPD_HERMES_SHARED_ENDPOINTS="h1")
    runtime = dstack.runtime
    dstack.fake.mcp_tools["aip_call"] = runtime.tool_for(f"h1@{TENANT_A}")
    request = dstack.request(tenant_id=TENANT_A, delegator=USER_A)
    await dstack.approve_child(request, approver=APPROVER_A)
    result = await (await dstack.delegate(request, approve=False)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.output["delegation_result"]["result"]["action_id"] == request.action.id
    # The same Hermes principal acting in another tenant's partition is refused.
    dstack.runtime.fault = RuntimeFault.TENANT_DRIFT
    drifted = dstack.request(tenant_id=TENANT_A, delegator=USER_A)
    await dstack.approve_child(drifted, approver=APPROVER_A)
    failed = await (await dstack.delegate(drifted, approve=False)).result(timeout_s=30)
    assert failed.error is not None
    assert failed.error.code == PREFIX + "delegated_tenant_mismatch"


async def test_a_child_outside_the_delegators_tenant_is_refused(dstack: DelegationStack) -> None:
    from worker.testing.identities import TENANT_A, TENANT_B, USER_A

    # Exempt from the child approval (which would refuse a foreign tenant first, in the
    # runbook's order), so the child-tenant check itself answers.
    await dstack.stack.spawn(
        "w1", AIPD_HERMES_OPERATOR_DELEGATION_APPROVAL_EXEMPT_PREFIXES="cap:support_sandbox:"
    )
    request = dstack.request(tenant_id=TENANT_A, delegator=USER_A)
    child = msgspec.structs.replace(
        request.action,
        identity=msgspec.structs.replace(request.action.identity, tenant_id=TENANT_B),
    )
    request = msgspec.structs.replace(request, action=child)
    result = await (await dstack.delegate(request, approve=False)).result(timeout_s=30)
    assert result.error is not None
    assert result.error.code == PREFIX + "tenant_mismatch", result.error
    assert dstack.fake.stats().count(POST_RUNS) == 0
