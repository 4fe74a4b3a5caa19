"""Who may resume an operator run, decided by the trust gate against the source binding.

The binding in Redis is the one a worker wrote for the source Action (its verified
principal and tenant); the resume is a signed envelope through the real gate. The approval
step is left out (an approval-free operator spec) so each refusal has exactly one cause.
"""

from __future__ import annotations

import dataclasses

import pytest
from redis.asyncio import Redis
from trust_support import UNGOVERNED, action_document, encode_action, endpoint

from schemas.errors import ErrorCode
from schemas.ids import new_action_id
from worker.errors import ConnectorError
from worker.operator.binding import BindingState, OperatorBinding, encode_binding
from worker.store.keys import ActionKeys, binding_key
from worker.store.stores import Stores
from worker.testing.identities import (
    APPROVER_A,
    APPROVER_B,
    TENANT_A,
    TENANT_B,
    USER_A,
    USER_B,
    TrustFiles,
)
from worker.trust.gate import TrustGate

RESUMABLE = dataclasses.replace(UNGOVERNED, name="operator")
SHARED = endpoint("hermes-a", shared=True)


async def source_binding(redis: Redis, principal: str | None, tenant: str | None) -> str:
    """A waiting source binding as a worker stored it; returns the source Action id."""
    source = new_action_id()
    binding = OperatorBinding(
        action_id=source,
        request_fingerprint="f",
        endpoint_id=SHARED.id,
        session_id=f"aip-operator-{source}",
        status=BindingState.WAITING_FOR_APPROVAL,
        created_at=1,
        updated_at=1,
        run_id="run_" + "1" * 32,
        principal_id=principal,
        tenant_id=tenant,
    )
    await redis.hset(binding_key(source), mapping={"doc": encode_binding(binding), "revision": 1})
    return source


async def resume_as(
    gate: TrustGate, redis: Redis, files: TrustFiles, source: str, principal: str, tenant: str
) -> None:
    doc = action_document(
        endpoint=SHARED.id,
        principal=principal,
        tenant=tenant,
        input={"resume": {"source_action_id": source, "choice": "always"}},
    )
    _, payload = encode_action(doc, files)
    await gate.admit(
        payload=payload,
        endpoint=SHARED,
        spec=RESUMABLE,
        stores=Stores.over(redis),
    )


async def test_the_runs_own_principal_and_its_tenants_authority_may_resume(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    source = await source_binding(redis, USER_A, TENANT_A)
    await resume_as(gate, redis, trust_files, source, USER_A, TENANT_A)
    await resume_as(gate, redis, trust_files, source, APPROVER_A, TENANT_A)


@pytest.mark.parametrize(
    ("principal", "tenant"),
    [(USER_B, TENANT_B), (APPROVER_B, TENANT_B)],
    ids=["another-tenants-user", "another-tenants-approver"],
)
async def test_anyone_else_is_refused(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, principal: str, tenant: str
) -> None:
    source = await source_binding(redis, USER_A, TENANT_A)
    with pytest.raises(ConnectorError) as caught:
        await resume_as(gate, redis, trust_files, source, principal, tenant)
    assert caught.value.code is ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT
    assert caught.value.message.startswith("resume: not the source run's principal")


async def test_an_older_workers_binding_is_judged_by_the_sources_lease(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    source = await source_binding(redis, None, None)
    lease = ActionKeys.of(source).lease
    await redis.hset(
        lease, mapping={"principal": USER_A, "tenant": TENANT_A, "capability": "cap:x"}
    )
    await resume_as(gate, redis, trust_files, source, USER_A, TENANT_A)
    with pytest.raises(ConnectorError) as caught:
        await resume_as(gate, redis, trust_files, source, USER_B, TENANT_B)
    assert caught.value.code is ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT


async def test_an_older_workers_binding_without_a_lease_is_resumed_by_no_one(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    source = await source_binding(redis, None, None)
    for principal, tenant in ((USER_A, TENANT_A), (APPROVER_A, TENANT_A)):
        with pytest.raises(ConnectorError) as caught:
            await resume_as(gate, redis, trust_files, source, principal, tenant)
        assert caught.value.code is ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT
        assert "older worker" in caught.value.message


async def test_a_resume_of_a_run_with_no_binding_is_left_to_the_ledger(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    # The ledger refuses it (operator_policy) without contacting Hermes; the gate has no
    # principal to compare and adds no second refusal.
    await resume_as(gate, redis, trust_files, new_action_id(), USER_B, TENANT_B)
