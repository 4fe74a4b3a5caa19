"""Delegation routed to two isolated Hermes instances, with a real downstream capability call.

Qualification items 8 and 9 of the connector overview, on this bus: two endpoints, each its
own fake Hermes, its own worker process and its own MCP principal (bearer token) on the real
AIP gateway. A delegation selects its endpoint by the delegate principal only; the Hermes it
reaches calls `aip_call` over MCP, and the child is a real Action
(`cap:hermes_agent:h2:models`) that the gateway dispatches to the other endpoint's queue by
its built-in route, where a worker executes and settles it. The delegation's result is
that child's verified native result, and both Actions leave their receipt chains.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.delegation import DelegationRequest
from schemas.result import ResultStatus
from subjects.grammar import envelope_msg_id
from tests.integration.stack import Stack
from worker.client import AipClient
from worker.testing.fake_hermes import FakeHermes
from worker.testing.gateway import (
    GatewayRuntime,
    gateway_runtime,
)
from worker.testing.services import ServiceHandle

from .support import downstream_bus, downstream_env, make_request

ENDPOINTS = ("h1", "h2")
POST_RUNS = "POST /v1/runs"


@dataclass
class TwoHermes:
    stack: Stack
    fakes: dict[str, FakeHermes]
    runtime: GatewayRuntime

    def request(self, endpoint_id: str, capability: str) -> DelegationRequest:
        return make_request(endpoint_id, capability=capability, child_input={})


@pytest.fixture
async def two(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> AsyncIterator[TwoHermes]:
    trust, api_key, key_file, nc, principals = await downstream_bus(
        tmp_path, nats_server.url, ENDPOINTS, ack_wait_s=3.0
    )
    async with (
        FakeHermes(api_key=api_key) as h1,
        FakeHermes(api_key=api_key) as h2,
        gateway_runtime(
            nats_server.url,
            tmp_path,
            trust.seed_file,
            principals,
            trusted_worker_keys_file=trust.worker_keys_file,  # children are workers' Actions
        ) as runtime,
    ):
        fakes = {"h1": h1, "h2": h2}
        client = AipClient(nc, sign_key=trust.seed_file)
        for endpoint_id, fake in fakes.items():
            fake.mcp_tools["aip_call"] = runtime.tool_for(endpoint_id)
        base = downstream_env(
            nats_server.url,
            redis_server.url,
            key_file,
            trust,
            "cap:hermes_agent:h2:models",
            lease_ttl_ms=3000,
            poll_interval_ms=50,
        )
        stack = Stack(
            root=tmp_path,
            nats_url=nats_server.url,
            redis_url=redis_server.url,
            fake=None,
            trust=trust,
            nc=nc,
            client=client,
            env=base,
        )
        try:
            # One isolated worker per Hermes instance: each serves exactly one endpoint.
            for endpoint_id, fake in fakes.items():
                await stack.spawn(
                    f"w-{endpoint_id}", AIPD_HERMES_ENDPOINTS=f"{endpoint_id}={fake.url}"
                )
            yield TwoHermes(stack, fakes, runtime)
        finally:
            stack.stop_workers()
            await nc.close()


async def test_a_delegation_reaches_only_its_hermes_and_returns_the_downstream_result(
    two: TwoHermes,
) -> None:
    request = two.request("h1", "cap:hermes_agent:h2:models")
    handle = await two.stack.client.delegate(request)
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    child = result.output["delegation_result"]["result"]
    assert child["action_id"] == request.action.id
    # The native result of the downstream call: h2's model list, executed by w-h2.
    downstream = await two.stack.client.handle("h2", request.action.id).result(timeout_s=5)
    assert downstream.settled_by == "w-h2"
    assert child["output"] == downstream.output
    assert downstream.output["data"][0]["id"] == "hermes-agent"
    # Routing: only h1's Hermes started a run; h2 served one plain read.
    assert two.fakes["h1"].stats().count(POST_RUNS) == 1
    assert two.fakes["h2"].stats().count(POST_RUNS) == 0
    assert two.fakes["h2"].stats().count("GET /v1/models") == 1
    assert result.settled_by == "w-h1"
    # Exact child-action execution and retained receipts for both Actions.
    assert two.runtime.calls[0]["action_id"] == request.action.id
    delegated = {r.event.value for r in await two.stack.client.receipts("h1", handle.action_id)}
    assert {"received", "lease_acquired", "start_claimed", "run_bound", "settled"} <= delegated
    executed = {r.event.value for r in await two.stack.client.receipts("h2", request.action.id)}
    assert {"received", "lease_acquired", "settled"} <= executed
    # The gateway's receipt of the aip_call that created the child, on the child's chain.
    gateway_receipts = [
        r
        for r in await two.stack.client.receipts("h2", request.action.id)
        if r.event.value == "tool_call"
    ]
    assert [r.details["tool"] for r in gateway_receipts] == ["aip_call"]
    assert gateway_receipts[0].details["principal_id"] == "agent:hermes_operator:h1"


async def test_each_instance_runs_as_its_own_principal(two: TwoHermes) -> None:
    first = two.request("h1", "cap:hermes_agent:h2:models")
    second = two.request("h2", "cap:hermes_agent:h2:models")
    results = [
        await (await two.stack.client.delegate(r)).result(timeout_s=60) for r in (first, second)
    ]
    assert [r.status for r in results] == [ResultStatus.COMPLETED, ResultStatus.COMPLETED]
    assert [r.settled_by for r in results] == ["w-h1", "w-h2"]
    assert two.fakes["h1"].stats().count(POST_RUNS) == 1
    assert two.fakes["h2"].stats().count(POST_RUNS) == 1


async def test_a_delegation_on_the_wrong_endpoint_subject_is_refused(two: TwoHermes) -> None:
    request = two.request("h2", "cap:hermes_agent:h2:models")
    payload = two.stack.client.seal_delegation(request)
    from worker.delegation import delegation_action_id

    action_id = delegation_action_id(request.delegation_id)
    headers = {"Nats-Msg-Id": envelope_msg_id(action_id, payload)}
    await two.stack.nc.jetstream().publish(
        two.stack.subjects.delegations("h1"), payload, headers=headers
    )
    result = await two.stack.client.handle("h1", action_id).result(timeout_s=30)
    assert result.error is not None
    assert result.error.code == "connector_host.route_mismatch"
    assert two.fakes["h1"].stats().count(POST_RUNS) == 0
    assert two.fakes["h2"].stats().count(POST_RUNS) == 0
