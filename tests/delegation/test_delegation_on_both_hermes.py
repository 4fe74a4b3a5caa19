"""The delegation happy path and its key failure, through a worker process, against the fake
Hermes and the real hermes-agent 0.19.0 alike.

Both reach `aip_call` on the real AIP gateway over MCP (the real Hermes with its own
`mcp_servers.aip` entry, the fake through the SDK's client), authenticated by a bearer token
as `agent:hermes_operator:h1`; the gateway records the child, dispatches it to the echo
capability on the bus and settles it, so both sides are judged by the same assertions.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack, provision_streams, worker_env
from worker.client import AipClient
from worker.delegation.payload import aip_call_arguments
from worker.testing.fake_hermes import FakeHermes
from worker.testing.gateway import gateway_runtime, hermes_principal_id
from worker.testing.identities import write_api_key_file, write_trust_files
from worker.testing.runtime_faults import RuntimeFault
from worker.testing.scenario import NEEDS_APPROVAL, OFF_CONTRACT
from worker.testing.services import ServiceHandle

from .conftest import CHILD_PREFIX, DELEGATION_ENV, DelegationStack

POST_RUNS = "POST /v1/runs"


@pytest.fixture(params=["fake", "real"])
async def both(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    nats_server: ServiceHandle,
    redis_server: ServiceHandle,
) -> AsyncIterator[DelegationStack]:
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    api_key, key_file = write_api_key_file(tmp_path)
    await provision_streams(nats_server.url, ack_wait_s=15)
    nc = await nats.connect(nats_server.url)
    async with contextlib.AsyncExitStack() as exits:
        runtime = await exits.enter_async_context(
            gateway_runtime(
                nats_server.url,
                tmp_path,
                trust.seed_file,
                {ENDPOINT: (hermes_principal_id(ENDPOINT), None)},
            )
        )
        hermes: Any
        if request.param == "fake":
            hermes = await exits.enter_async_context(FakeHermes(api_key=api_key))
            hermes.mcp_tools["aip_call"] = runtime.tool_for(ENDPOINT)
        else:
            from worker.testing.real_hermes import RealHermes

            # Hermes lists MCP tools when it starts: the gateway is already serving.
            mcp_servers = {"aip": (runtime.url, runtime.tokens[ENDPOINT])}
            hermes = await exits.enter_async_context(
                RealHermes(tmp_path / "hermes", api_key=api_key, mcp_servers=mcp_servers)
            )
        stack = Stack(
            root=tmp_path,
            nats_url=nats_server.url,
            redis_url=redis_server.url,
            fake=hermes if request.param == "fake" else None,
            trust=trust,
            nc=nc,
            client=AipClient(nc, sign_key=trust.seed_file),
            env=worker_env(
                nats_server.url,
                redis_server.url,
                hermes.url,
                key_file,
                trust,
                lease_ttl_ms=15_000,
                **{
                    **DELEGATION_ENV,
                    "AIPD_HERMES_OPERATOR_DELEGATION_APPROVAL_EXEMPT_PREFIXES": CHILD_PREFIX,
                    "AIPD_HERMES_OPERATOR_POLL_INTERVAL_MS": "100",
                },
            ),
        )
        try:
            await stack.spawn("w1")
            yield DelegationStack(stack, runtime)
        finally:
            stack.stop_workers()
            await nc.close()


@pytest.mark.aip_family("streaming_backpressure", assertions=["ordered_chunks"])
async def test_hermes_calls_aip_call_once_and_the_result_is_the_native_child(
    both: DelegationStack,
) -> None:
    request = both.request()
    handle = await both.stack.client.delegate(request)
    result = await handle.result(timeout_s=90)
    assert result.status is ResultStatus.COMPLETED, result.error
    child = result.output["delegation_result"]["result"]
    assert child["action_id"] == request.action.id
    expected = {"echo": request.action.input, "capability": request.action.capability}
    assert child["output"] == expected
    assert both.runtime.calls == [aip_call_arguments(request.action)]
    operator = result.output["operator"]
    assert operator["status"] == "completed"
    assert operator["provider"]["output"].startswith("I called aip_call once.")
    chunks = [c async for c in handle.chunks(idle_timeout_s=10)]
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    tools = [c.payload for c in chunks if c.provider_event in ("tool.started", "tool.completed")]
    assert [t["tool"] for t in tools] == ["mcp__aip__aip_call"] * 2
    if both.stack.fake is not None:
        assert both.stack.fake.stats().count(POST_RUNS) == 1


@pytest.mark.aip_family("schema_enforcement", assertions=["invalid_output_rejected"])
async def test_a_child_hermes_only_talked_about_is_not_observed(both: DelegationStack) -> None:
    both.runtime.fault = RuntimeFault.NOT_CREATED
    result = await (await both.stack.client.delegate(both.request())).result(timeout_s=90)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.delegated_execution_not_observed"
    assert result.output["operator"]["status"] == "completed"
    assert "result" not in result.output["delegation_result"]
    assert len(both.runtime.calls) == 1


async def test_an_off_contract_run_asking_approval_is_stopped_not_parked(
    both: DelegationStack,
) -> None:
    # The model ignores the contract and runs a dangerous command: Hermes asks approval.
    request = both.request(child_input={"note": f"{OFF_CONTRACT} {NEEDS_APPROVAL}"})
    handle = await both.stack.client.delegate(request)
    result = await handle.result(timeout_s=90)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.operator_policy", result.error
    assert "approval" in result.error.message
    assert result.output["operator"]["status"] == "cancelled"
    assert "result" not in result.output["delegation_result"]
    assert both.runtime.calls == []
    chunks = [c async for c in handle.chunks(idle_timeout_s=10)]
    assert any(c.provider_event == "approval.request" for c in chunks)
    if both.stack.fake is not None:
        assert both.stack.fake.stats().count("POST /v1/runs/{run_id}/stop") == 1
