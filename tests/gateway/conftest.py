"""A deployment around the real gateway: NATS, Redis, a worker serving `h1` (fake Hermes),
and `python -m worker gateway` processes with a principals file of several tokens.

`gs_up` starts one for the test. A module whose tests neither kill, pause nor reconfigure the
deployment's processes shares one instead (`gs_shared`): its start-up (two Python processes,
the suite's main CPU cost) is paid once per module and xdist process, not once per test.
Isolation stays real: every Action id is the test's own, the fake Hermes' counts and faults
are reset before each test, the runtime queue and audit streams are read from where they
stood when the test began (`stored_in_this_test`), and workers and gateways a test starts
are stopped after it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio

from subjects.grammar import Subjects
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

    async def stored_in_this_test(self, stream: str, subject: str) -> list[bytes]:
        """The messages on `subject` that `stream` stored since the test began (`gs_shared`
        marks where each of `MARKED_STREAMS` stood)."""
        return [data for _, data in await self._stored_since(stream, subject, new_only=False)]

    async def enqueued_in_this_test(self) -> list[bytes]:
        """The runtime queue's entries of children this test created: entries stored since
        it began for an Action id the queue had not seen before (a shared gateway's sweep
        still settles an earlier test's child meanwhile)."""
        found = await self._stored_since(QUEUE_STREAM, "aip.runtime.queue.*", new_only=True)
        return [data for _, data in found]

    async def _stored_since(
        self, stream: str, subject: str, *, new_only: bool
    ) -> list[tuple[str, bytes]]:
        sub = await self.stack.nc.jetstream().subscribe(subject, ordered_consumer=True)
        earlier: set[str] = set()
        out: list[tuple[str, bytes]] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except nats.errors.TimeoutError:
                    break
                if msg.metadata.sequence.stream <= self.marks[stream]:
                    earlier.add(msg.subject)
                else:
                    out.append((msg.subject, msg.data))
        finally:
            await sub.unsubscribe()
        return [(s, data) for s, data in out if not (new_only and s in earlier)]


QUEUE_STREAM = Subjects().runtime_stream_name("queue")
AUDIT_STREAM = Subjects().stream_name("audit")
#: The streams whose position `gs_shared` marks before each test.
MARKED_STREAMS = (QUEUE_STREAM, AUDIT_STREAM)


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


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def module_gs(
    tmp_path_factory: pytest.TempPathFactory,
    module_nats_server: ServiceHandle,
    module_redis_server: ServiceHandle,
) -> AsyncIterator[GatewayStack]:
    """`gs_up`'s deployment on servers of its own, for a whole module (`gs_shared`)."""
    root = tmp_path_factory.mktemp("gateway-module")
    async with gateway_stack(root, module_nats_server.url, module_redis_server.url) as gs:
        await gs.start_gateway("g1", AIPD_GATEWAY_MAX_INPUT_BYTES="2048")
        yield gs


@pytest_asyncio.fixture(loop_scope="session")
async def gs_shared(module_gs: GatewayStack) -> AsyncIterator[GatewayStack]:
    """The module's deployment for one test (module docstring). A module opts in by running
    its tests on the session's loop (`pytest.mark.asyncio(loop_scope="session")`) and
    defining its `gs_up` as this fixture."""
    gs = module_gs
    assert gs.stack.fake is not None
    live = [*gs.stack.workers, *gs.gateways]
    assert all(p.alive for p in live), "a process of the module's deployment died"
    gs.stack.fake.reset()
    js = gs.stack.nc.jetstream()
    for stream in MARKED_STREAMS:
        gs.marks[stream] = (await js.stream_info(stream)).state.last_seq
    workers, gateways = len(gs.stack.workers), len(gs.gateways)
    try:
        yield gs
    finally:
        for proc in [*gs.stack.workers[workers:], *gs.gateways[gateways:]]:
            proc.terminate(10)
        del gs.stack.workers[workers:]
        del gs.gateways[gateways:]
