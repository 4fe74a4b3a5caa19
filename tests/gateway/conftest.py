"""A deployment around the real gateway: NATS, Redis, a worker serving `h1` (fake Hermes),
and `python -m worker gateway` processes with a principals file of several tokens."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.stack import Stack, fake_stack
from worker.gateway.service import namespaced_action_id
from worker.testing._procs import free_port
from worker.testing.gateway import (
    directory_entry,
    gateway_env,
    gateway_process,
    hermes_principal_id,
    principal_entry,
    write_principals_file,
)
from worker.testing.identities import TENANT_A, TENANT_B, identity_entries, write_trust_files
from worker.testing.services import ServiceHandle
from worker.testing.workers import WorkerProcess

#: The Hermes of endpoint h1, with every tool scope.
H1_TOKEN = "tok-h1-" + "a" * 32
#: Another principal (h2's Hermes), every scope.
OTHER_TOKEN = "tok-h2-" + "b" * 32
#: h1's principal id again, but a credential for another tenant.
OTHER_TENANT_TOKEN = "tok-h1-tenant-b-" + "c" * 24
#: A tenant-A principal (an endpoint bound to tenant A serves it).
TENANT_A_TOKEN = "tok-tenant-a-" + "f" * 27
#: Only `capability:read`.
READ_ONLY_TOKEN = "tok-read-" + "d" * 30
#: Expired a minute ago.
EXPIRED_TOKEN = "tok-expired-" + "e" * 28
#: A principal that is no delegate (an MCP agent of its own, not a Hermes operator).
AGENT_TOKEN = "tok-agent-" + "9" * 30
AGENT = "agent:support-bot"
H1 = hermes_principal_id("h1")


def bus_id(
    arguments: Mapping[str, Any], principal_id: str = H1, tenant_id: str | None = None
) -> str:
    """The id the gateway gives the child of `arguments` (their `action_id` is namespaced
    per principal, docs/gateway.md)."""
    return namespaced_action_id(principal_id, tenant_id, str(arguments["action_id"]))


@dataclass
class GatewayStack:
    stack: Stack
    env: dict[str, str]
    port: int
    gateways: list[WorkerProcess] = field(default_factory=list)
    #: Stream name -> its last sequence when the test started (a stack shared by a module's
    #: tests: each reads only what it caused).
    marks: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start_gateway(
        self, name: str, *, port: int | None = None, **env: str
    ) -> WorkerProcess:
        for attempt in range(3):
            full = {**self.env, **env}
            if port is not None:
                full["AIPD_GATEWAY_PORT"] = str(port)
            proc = gateway_process(name, full, self.stack.root)
            self.gateways.append(proc)
            try:
                return await asyncio.to_thread(proc.start, wait_ready_s=20.0)
            except RuntimeError:
                # The free port was taken between `free_port()` and the bind (another xdist
                # process's server; CI saw it once): the stack's own port moves on. A port
                # the test chose is its to keep, and any other exit is the test's failure.
                if port is not None or attempt == 2 or "already in use" not in proc.log_tail():
                    raise
                self.port = free_port()
                self.env["AIPD_GATEWAY_PORT"] = str(self.port)
        raise AssertionError("unreachable")

    def stop(self) -> None:
        for proc in self.gateways:
            if proc.alive:
                proc.terminate(10)


@contextlib.asynccontextmanager
async def gateway_stack(root: Path, nats_url: str, redis_url: str) -> AsyncIterator[GatewayStack]:
    """The deployment under `root` on the given servers: trust and principals files, the fake
    Hermes, worker `w1` serving h1 (shared by every tenant), and no gateway yet."""
    trust_dir = root / "trust"
    trust_dir.mkdir()
    # The gateway's principals are directory identities too: their children run as them.
    identities = [
        *identity_entries(),
        directory_entry(H1),
        directory_entry(hermes_principal_id("h2")),
    ]
    trust = write_trust_files(trust_dir, identities=identities)
    principals = write_principals_file(
        trust_dir,
        [
            principal_entry(H1_TOKEN, H1),
            principal_entry(OTHER_TOKEN, hermes_principal_id("h2")),
            principal_entry(OTHER_TENANT_TOKEN, H1, tenant_id=TENANT_B),
            principal_entry(TENANT_A_TOKEN, hermes_principal_id("ha"), tenant_id=TENANT_A),
            principal_entry(READ_ONLY_TOKEN, H1, scopes=["capability:read"]),
            principal_entry(EXPIRED_TOKEN, H1, valid_for_ms=-60_000),
            principal_entry(AGENT_TOKEN, AGENT),
        ],
    )
    async with fake_stack(root, nats_url, redis_url, trust, lease_ttl_ms=3000) as stack:
        port = free_port()
        env = gateway_env(
            nats_url,
            principals,
            trust.seed_file,
            port,
            AIPD_LOG_FORMAT="json",
            AIPD_GATEWAY_SETTLE_GRACE_MS="500",
        )
        gs = GatewayStack(stack, env, port)
        try:
            # h1 is bound to no tenant and serves every principal's tenant: shared.
            await stack.spawn("w1", AIPD_HERMES_SHARED_ENDPOINTS="h1")
            yield gs
        finally:
            gs.stop()


@pytest.fixture
async def gstack(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> AsyncIterator[GatewayStack]:
    async with gateway_stack(tmp_path, nats_server.url, redis_server.url) as gs:
        yield gs


@pytest.fixture
async def gs_up(gstack: GatewayStack) -> GatewayStack:
    """The stack with one gateway process running (small input bound for the size test)."""
    await gstack.start_gateway("g1", AIPD_GATEWAY_MAX_INPUT_BYTES="2048")
    return gstack
