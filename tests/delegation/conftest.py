from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.delegation import DelegationRequest
from tests.integration.stack import ENDPOINT, Stack, fake_stack
from worker.client import ActionHandle
from worker.testing.fake_hermes import FakeHermes
from worker.testing.gateway import GatewayRuntime, gateway_runtime, hermes_principal_id
from worker.testing.identities import (
    APPROVER_UNTENANTED,
    authority_memberships,
    write_trust_files,
)
from worker.testing.services import ServiceHandle

from .support import make_request

LEASE_TTL_MS = 3000
CHILD_PREFIX = "cap:support_sandbox:"
#: Delegation on, for the test's child capabilities and scopes, polling fast.
DELEGATION_ENV = {
    "AIPD_HERMES_OPERATOR_DELEGATION_ENABLED": "true",
    "AIPD_HERMES_OPERATOR_CAPABILITY_PREFIXES": CHILD_PREFIX,
    "AIPD_HERMES_OPERATOR_SCOPE_PREFIXES": "support.",
    "AIPD_HERMES_OPERATOR_POLL_INTERVAL_MS": "50",
}


@dataclass
class DelegationStack:
    """The integration Stack with delegation enabled, plus the real AIP gateway (in-process,
    its store writer faultable) that the fake Hermes calls `aip_call` on over MCP."""

    stack: Stack
    runtime: GatewayRuntime

    @property
    def fake(self) -> FakeHermes:
        assert self.stack.fake is not None
        return self.stack.fake

    def request(self, **kw: object) -> DelegationRequest:
        return make_request(ENDPOINT, **kw)  # type: ignore[arg-type]

    async def approve_child(
        self, request: DelegationRequest, approver: str = APPROVER_UNTENANTED
    ) -> None:
        """Record the approval authority's decision on the exact child Action."""
        await self.stack.approve(request.action, approver=approver)

    async def delegate(
        self, request: DelegationRequest, *, approve: bool = True, dedupe: bool = True
    ) -> ActionHandle:
        """Publish `request`; `dedupe=False` sends no `Nats-Msg-Id`, so the stream stores
        every copy (as it does for a copy that arrives after the duplicate window)."""
        if approve:
            await self.approve_child(request)
        if dedupe:
            return await self.stack.client.delegate(request)
        payload = self.stack.client.seal_delegation(request)
        await self.stack.nc.jetstream().publish(
            self.stack.subjects.delegations(ENDPOINT), payload
        )
        from worker.delegation import delegation_action_id

        return self.stack.client.handle(ENDPOINT, delegation_action_id(request.delegation_id))


@pytest.fixture
async def dstack(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> AsyncIterator[DelegationStack]:
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    memberships = authority_memberships()
    for membership in memberships:
        membership["capability_prefixes"] = [*membership["capability_prefixes"], CHILD_PREFIX]
    trust = write_trust_files(trust_dir, memberships=memberships)
    async with fake_stack(
        tmp_path,
        nats_server.url,
        redis_server.url,
        trust,
        lease_ttl_ms=LEASE_TTL_MS,
        **DELEGATION_ENV,
    ) as stack:
        from worker.testing.identities import TENANT_A

        principals = {
            ENDPOINT: (hermes_principal_id(ENDPOINT), None),
            f"{ENDPOINT}@{TENANT_A}": (hermes_principal_id(ENDPOINT), TENANT_A),
        }
        async with gateway_runtime(
            stack.nats_url, tmp_path, trust.seed_file, principals
        ) as runtime:
            assert stack.fake is not None
            stack.fake.mcp_tools["aip_call"] = runtime.tool_for(ENDPOINT)
            yield DelegationStack(stack, runtime)
