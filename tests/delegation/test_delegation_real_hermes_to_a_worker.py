"""First-class delegation with nothing fake on the AIP side: the real Hermes 0.19.0, the real
gateway, and a downstream capability served by a worker on the bus.

The delegate is `agent:hermes_operator:h1`, a real hermes-agent whose `mcp_servers.aip` entry
points at the gateway with its own bearer token; the child is `cap:hermes_agent:h2:models`,
which the gateway routes to h2's queue, where another worker process executes it against its
own (fake) Hermes. The delegation's result must be that child's verified native result, and
the receipts of both Actions must be retained.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.testing.fake_hermes import FakeHermes
from worker.testing.gateway import GatewayRuntime
from worker.testing.services import ServiceHandle

from .support import make_request, real_hermes_to_a_worker

pytestmark = pytest.mark.real_hermes

CHILD = "cap:hermes_agent:h2:models"


@dataclass
class RealToWorker:
    stack: Stack
    downstream: FakeHermes
    runtime: GatewayRuntime


@pytest.fixture
async def real_to_worker(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> AsyncIterator[RealToWorker]:
    async with real_hermes_to_a_worker(tmp_path, nats_server.url, redis_server.url, CHILD) as (
        stack,
        downstream,
        runtime,
    ):
        yield RealToWorker(stack, downstream, runtime)


async def test_the_real_hermes_delegates_to_a_capability_a_worker_serves(
    real_to_worker: RealToWorker,
) -> None:
    stack = real_to_worker.stack
    request = make_request("h1", capability=CHILD, child_input={})
    handle = await stack.client.delegate(request)
    result = await handle.result(timeout_s=120)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.settled_by == "w-h1"
    # The delegation's result is the child's verified native result, executed by w-h2.
    child = result.output["delegation_result"]["result"]
    assert child["action_id"] == request.action.id
    downstream = await stack.client.handle("h2", request.action.id).result(timeout_s=10)
    assert downstream.settled_by == "w-h2"
    assert child["output"] == downstream.output
    assert real_to_worker.downstream.stats().count("GET /v1/models") == 1
    # Exactly one aip_call, with the exact child Action.
    assert [call["action_id"] for call in real_to_worker.runtime.calls] == [request.action.id]
    # Receipts of both Actions are retained: the delegation's and the child's.
    delegated = {r.event.value for r in await stack.client.receipts("h1", handle.action_id)}
    assert {"received", "lease_acquired", "start_claimed", "run_bound", "settled"} <= delegated
    executed = {r.event.value for r in await stack.client.receipts("h2", request.action.id)}
    assert {"received", "lease_acquired", "settled", "tool_call"} <= executed
