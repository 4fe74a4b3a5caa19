"""Endpoint tenant binding: two endpoints bound to two tenants never serve each other's."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from trust_support import UNGOVERNED, action_document, encode_action, endpoint, now_ms

from schemas.errors import ErrorCode
from worker.endpoints import Endpoint
from worker.errors import ConnectorError
from worker.store.stores import Stores
from worker.testing.identities import (
    TENANT_A,
    TENANT_B,
    USER_A,
    USER_B,
    USER_UNTENANTED,
    TrustFiles,
)
from worker.trust.gate import AdmitDecision, TrustGate

ENDPOINT_A = endpoint("hermes-a", tenant=TENANT_A)
ENDPOINT_B = endpoint("hermes-b", tenant=TENANT_B)
CALLERS = {USER_A: TENANT_A, USER_B: TENANT_B}


async def admit(
    gate: TrustGate, redis: Redis, files: TrustFiles, target: Endpoint, **doc: Any
) -> AdmitDecision:
    _, payload = encode_action(action_document(endpoint=target.id, **doc), files)
    return await gate.admit(
        payload=payload,
        endpoint=target,
        spec=UNGOVERNED,
        stores=Stores.over(redis),
    )


@pytest.mark.parametrize("principal", [USER_A, USER_B])
async def test_each_tenant_reaches_only_its_own_endpoint(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, principal: str
) -> None:
    tenant = CALLERS[principal]
    own, other = (ENDPOINT_A, ENDPOINT_B) if tenant == TENANT_A else (ENDPOINT_B, ENDPOINT_A)
    decision = await admit(gate, redis, trust_files, own, principal=principal, tenant=tenant)
    assert decision.tenant_id == tenant
    assert decision.headers["X-AIP-Tenant-Id"] == tenant
    with pytest.raises(ConnectorError) as caught:
        await admit(gate, redis, trust_files, other, principal=principal, tenant=tenant)
    assert caught.value.code is ErrorCode.TENANT_MISMATCH


async def test_a_tenant_claimed_in_input_does_not_open_another_tenants_endpoint(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    forged_input = {"tenant_id": TENANT_B, "_aip": {"tenant_id": TENANT_B, "principal_id": USER_B}}
    with pytest.raises(ConnectorError) as caught:
        await admit(gate, redis, trust_files, ENDPOINT_B, input=forged_input)
    assert caught.value.code is ErrorCode.TENANT_MISMATCH


async def test_an_action_without_a_verified_tenant_is_refused_by_bound_endpoints(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    for target in (ENDPOINT_A, ENDPOINT_B):
        with pytest.raises(ConnectorError) as caught:
            await admit(gate, redis, trust_files, target, principal=USER_UNTENANTED, tenant=None)
        assert caught.value.code is ErrorCode.TENANT_MISMATCH


async def test_a_shared_unbound_endpoint_serves_every_verified_tenant(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    shared = endpoint("hermes-c", shared=True)
    for principal, tenant in ((USER_A, TENANT_A), (USER_B, TENANT_B), (USER_UNTENANTED, None)):
        decision = await admit(gate, redis, trust_files, shared, principal=principal, tenant=tenant)
        assert decision.tenant_id == tenant


async def test_an_unbound_unshared_endpoint_refuses_every_action_carrying_a_tenant(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    unbound = endpoint("hermes-c", shared=False)
    for principal, tenant in ((USER_A, TENANT_A), (USER_B, TENANT_B)):
        with pytest.raises(ConnectorError) as caught:
            await admit(gate, redis, trust_files, unbound, principal=principal, tenant=tenant)
        assert caught.value.code is ErrorCode.TENANT_MISMATCH
        assert "not configured shared" in caught.value.message
    decision = await admit(
        gate, redis, trust_files, unbound, principal=USER_UNTENANTED, tenant=None
    )
    assert decision.tenant_id is None


async def test_an_expired_binding_refuses_even_its_own_tenant(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    live = endpoint("hermes-a", tenant=TENANT_A, tenant_expires_at_unix_ms=now_ms() + 60_000)
    assert (await admit(gate, redis, trust_files, live)).tenant_id == TENANT_A
    expired = endpoint("hermes-a", tenant=TENANT_A, tenant_expires_at_unix_ms=now_ms() - 1)
    with pytest.raises(ConnectorError) as caught:
        await admit(gate, redis, trust_files, expired)
    assert caught.value.code is ErrorCode.TENANT_MISMATCH
    assert "expired" in caught.value.message


async def test_a_capability_of_another_endpoint_is_a_route_mismatch(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    _, payload = encode_action(action_document(endpoint="hermes-b"), trust_files)
    with pytest.raises(ConnectorError) as caught:
        await gate.admit(
            payload=payload,
            endpoint=ENDPOINT_A,
            spec=UNGOVERNED,
            stores=Stores.over(redis),
        )
    assert caught.value.code is ErrorCode.HOST_ROUTE_MISMATCH
