"""First-class delegation reaches `aip_call` the same way on the fake and the real Hermes 0.19.0.

Spec "Route first-class delegation": Hermes receives the exact child Action as
`aip_call_arguments` and must call `aip_call` exactly once with them. The worker's delegation
tests run against the fake Hermes, which calls the tool in-process (`fake.mcp_tools`); these
tests hold that fake to the real Hermes, both calling `aip_call` on the real AIP gateway
(`worker.gateway`, in-process, bearer-authenticated as the delegate): the real Hermes through
its own MCP client over Streamable HTTP, the fake through the `mcp` SDK's client. If the real
one disagrees, the fake is wrong.

Two real Hermes serve this module: one configured with the AIP gateway, one without it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from schemas.action import DelegationRef, Identity
from schemas.delegation import DELEGATE_PREFIX, ChildAction, DelegationRequest
from schemas.ids import new_action_id
from schemas.lifecycle import LifecycleState
from subjects.grammar import Subjects
from tests.conformance.run_events import (
    AFTER_TOOL,
    Event,
    names,
    read_events,
    start_run,
    status_of,
    text_of,
)
from worker.delegation.payload import aip_call_arguments, delegated_payload
from worker.delegation.stores import JetStreamLifecycleStores
from worker.delegation.verify import verify_child
from worker.operator.binding import session_id_for
from worker.operator.policy import HermesOperatorPolicy
from worker.testing.fake_hermes import FakeHermes
from worker.testing.fake_hermes.mcp import AIP_CALL
from worker.testing.gateway import GatewayRuntime, gateway_runtime
from worker.testing.identities import write_trust_files
from worker.testing.real_hermes import RealHermes, ensure_hermes_venv
from worker.testing.runtime_faults import RuntimeFault
from worker.testing.scenario import AIP_CALL_TOOL, delegated_final_text, reply_text
from worker.testing.services import ServiceHandle
from worker.trust.signing import TrustedGatewayKeys

pytestmark = pytest.mark.asyncio(loop_scope="session")

ENDPOINT = "h1"
DELEGATE = DELEGATE_PREFIX + ENDPOINT
CHILD_CAPABILITY = "cap:support_sandbox:case.get"
DELEGATOR = "user:alice"


# --- builders ------------------------------------------------------------------------------


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def delegation_request(capability: str = CHILD_CAPABILITY) -> DelegationRequest:
    """A valid request whose child uses every kind of JSON value the contract may carry."""
    delegation_id = "dlg-" + secrets.token_hex(8)
    created = now_ms()
    child = ChildAction(
        id=new_action_id(),
        capability=capability,
        input={
            "case_id": "case-2030",
            "note": "ünïcode — ключ",
            "limit": 3,
            "ratio": 0.5,
            "flags": [True, False, None],
            "nested": {"empty": {}, "list": []},
        },
        identity=Identity(principal_id=DELEGATE, principal_kind="agent"),
        created_at_unix_ms=created,
        idempotency_key="idem-" + secrets.token_hex(6),
        timeout_ms=60_000,
        conversation={"id": "conv_" + "c" * 32, "channel": {"thread": "t-1"}, "status": "open"},
        memory={"notes": ["keep"]},
        delegation=DelegationRef(
            delegation_id=delegation_id, parent_action_id=new_action_id(), chain=[DELEGATOR]
        ),
    )
    return DelegationRequest(
        delegation_id=delegation_id,
        delegator=Identity(
            principal_id=DELEGATOR,
            principal_kind="user",
            authentication_issuer="https://idp.example.test",
            credential_revision=3,
        ),
        delegate=DELEGATE,
        action=child,
        chain=[DELEGATOR],
        scopes=["support.read"],
        created_at_unix_ms=created,
        deadline_unix_ms=created + 60_000,
    )


def delegated_body(request: DelegationRequest) -> dict[str, Any]:
    """Exactly the `POST /v1/runs` body the worker's delegation sends for `request`."""
    operator_action_id = new_action_id()
    body: dict[str, Any] = json.loads(
        delegated_payload(HermesOperatorPolicy(), request, session_id_for(operator_action_id))
    )
    return body


async def start_delegated_run(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    fields = dict(body)
    return await start_run(client, fields.pop("input"), **fields)


# --- the servers under test ----------------------------------------------------------------


@dataclass
class ServerUnderTest:
    """One Hermes under test, calling `aip_call` on the real AIP gateway (fake: through the
    SDK's client in-process; real: its own MCP client, configured with the gateway)."""

    kind: str
    url: str
    api_key: str
    fake: FakeHermes | None
    runtime: GatewayRuntime | None
    nc: NATS | None = None
    real: RealHermes | None = None
    #: The workers' trusted key file, holding the gateway's public key.
    keys_file: Path | None = None

    @property
    def gateway(self) -> GatewayRuntime:
        assert self.runtime is not None
        return self.runtime

    def reset(self) -> None:
        """Forget the previous test's calls; no fault."""
        if self.runtime is not None:
            self.runtime.writer.requested.clear()
            self.runtime.fault = RuntimeFault.NONE


async def _real(
    tmp_path_factory: pytest.TempPathFactory, mcp_servers: dict[str, tuple[str, str]]
) -> AsyncIterator[RealHermes]:
    """A real gateway; a missing venv skips locally and fails under CI (as conftest's)."""
    await asyncio.to_thread(ensure_hermes_venv)
    workdir = tmp_path_factory.mktemp("real-hermes-mcp" if mcp_servers else "real-hermes")
    async with RealHermes(workdir, mcp_servers=mcp_servers) as real:
        yield real


@pytest_asyncio.fixture(scope="module", loop_scope="session", params=["fake", "real"])
async def delegating_hermes(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    module_nats_server: ServiceHandle,
) -> AsyncIterator[ServerUnderTest]:
    """The server under test with the gateway's tools available (parametrized)."""
    directory = tmp_path_factory.mktemp("gateway")
    trust = write_trust_files(directory)
    principals = {ENDPOINT: (DELEGATE, None)}
    nc = await nats.connect(module_nats_server.url)
    try:
        async with gateway_runtime(
            module_nats_server.url, directory, trust.seed_file, principals
        ) as runtime:
            if request.param == "real":
                # Hermes lists MCP tools only while its gateway starts: the AIP gateway first.
                servers = {"aip": (runtime.url, runtime.tokens[ENDPOINT])}
                async for real in _real(tmp_path_factory, servers):
                    yield ServerUnderTest(
                        "real",
                        real.url,
                        real.api_key,
                        None,
                        runtime,
                        nc,
                        real,
                        trust.gateway_keys_file,
                    )
                return
            async with FakeHermes(api_key=secrets.token_urlsafe(32)) as fake:
                fake.mcp_tools[AIP_CALL] = runtime.tool_for(ENDPOINT)
                yield ServerUnderTest(
                    "fake", fake.url, fake.api_key, fake, runtime, nc, None, trust.gateway_keys_file
                )
    finally:
        await nc.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session", params=["fake", "real"])
async def plain_hermes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ServerUnderTest]:
    """The server under test without any MCP tool (parametrized: `fake`, `real`).

    Not conftest's session `hermes`: a run changes what the real gateway's `/v1/toolsets`
    lists (it adds terminal tools on the first agent build), which the HTTP suite's discovery
    test must see untouched.
    """
    if request.param == "real":
        async for real in _real(tmp_path_factory, {}):
            yield ServerUnderTest("real", real.url, real.api_key, None, None, None, real)
        return
    async with FakeHermes(api_key=secrets.token_urlsafe(32)) as fake:
        yield ServerUnderTest("fake", fake.url, fake.api_key, fake, None)


def _client(server: ServerUnderTest) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    return httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30.0)


@pytest_asyncio.fixture(loop_scope="session")
async def delegating(delegating_hermes: ServerUnderTest) -> AsyncIterator[ServerUnderTest]:
    """The module's server, its gateway's record of calls reset around the test."""
    delegating_hermes.reset()
    yield delegating_hermes
    delegating_hermes.reset()


@pytest_asyncio.fixture(loop_scope="session")
async def delegating_client(delegating: ServerUnderTest) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(delegating) as http:
        yield http


@pytest_asyncio.fixture(loop_scope="session")
async def plain_client(plain_hermes: ServerUnderTest) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(plain_hermes) as http:
        yield http


async def refused_aip_calls(server: ServerUnderTest) -> float:
    """The gateway's count of refused `aip_call`s, read from its `/metrics`."""
    async with httpx.AsyncClient(base_url=server.gateway.gateway.base_url) as http:
        text = (await http.get("/metrics")).text
    series = 'aip_gateway_tool_calls_total{decision="refused",tool="aip_call"} '
    for line in text.splitlines():
        if line.startswith(series):
            return float(line[len(series) :])
    return 0.0


def tool_text(events: list[Event]) -> str:
    """What the run's final text says the tool returned (after the fixed prose prefix)."""
    final = str(events[-1]["output"])
    prefix = delegated_final_text("", False)
    assert final.startswith(prefix), final
    return final[len(prefix) :]


def assert_one_aip_call_then_prose(events: list[Event], *, failed: bool = False) -> None:
    """The event shape of a delegated run that called the tool once and then reported it."""
    assert names(events) == [
        "tool.started",
        "tool.completed",
        "message.delta",
        "reasoning.available",
        "run.completed",
    ]
    started, completed = events[0], events[1]
    assert started["tool"] == AIP_CALL_TOOL
    # Hermes has no main argument to preview for an MCP tool.
    assert started["preview"] is None
    assert completed["tool"] == AIP_CALL_TOOL
    assert completed["error"] is failed
    assert isinstance(completed["duration"], float)
    # The exact deltas are held to the real Hermes by their own test below.
    final = str(events[-1]["output"])
    assert text_of(events).strip() == final
    assert events[-2]["text"] == final


# --- delegation with the AIP MCP server ----------------------------------------------------


async def test_a_delegated_run_calls_aip_call_once_with_the_exact_arguments(
    delegating: ServerUnderTest, delegating_client: httpx.AsyncClient
) -> None:
    request = delegation_request()
    body = delegated_body(request)

    run_id = await start_delegated_run(delegating_client, body)
    events, _ = await read_events(delegating_client, run_id)

    # The gateway received the exact arguments (without identity) once, as the delegate.
    expected = aip_call_arguments(request.action)
    assert delegating.gateway.calls == [expected]
    assert "identity" not in expected
    if delegating.real is not None:
        # The include filter: the only MCP tool the model is offered is aip_call.
        offered = {
            name
            for call in delegating.real.llm.calls
            if call.user_text == body["input"]
            for name in call.tool_names
            if name.startswith("mcp_")
        }
        assert offered == {AIP_CALL_TOOL}
    assert_one_aip_call_then_prose(events)
    # What the tool returned is the reference facade's answer about this child: the child
    # is asynchronous, so `{action_id, ack}` naming it.
    assert f'"action_id": "{request.action.id}", "ack"' in tool_text(events)
    status = await status_of(delegating_client, run_id)
    assert status["status"] == "completed"
    assert status["output"] == events[-1]["output"]


async def test_the_aip_runtime_records_the_delegated_child_it_was_called_for(
    delegating: ServerUnderTest, delegating_client: httpx.AsyncClient
) -> None:
    request = delegation_request()

    run_id = await start_delegated_run(delegating_client, delegated_body(request))
    await read_events(delegating_client, run_id)

    assert delegating.gateway.calls == [aip_call_arguments(request.action)]
    assert delegating.nc is not None
    assert delegating.keys_file is not None
    trusted = TrustedGatewayKeys.load(delegating.keys_file)
    stores = JetStreamLifecycleStores(
        delegating.nc.jetstream(),
        Subjects(),
        trusted,
    )
    for _ in range(100):
        records = await stores.read(request.action.id)
        if records.queue is not None and records.queue.state.terminal:
            break
        await asyncio.sleep(0.1)

    assert records.queue is not None
    assert records.queue.state is LifecycleState.COMPLETED
    assert records.queue.owner_principal_id == DELEGATE
    # The worker's own check accepts what Hermes made the gateway record.
    result = verify_child(
        request.action,
        delegate=DELEGATE,
        tenant_id=None,
        queue=records.queue,
        lifecycle=records.lifecycle,
        now_ms=now_ms(),
    )
    assert result is not None
    assert result.action_id == request.action.id
    assert result.status == "completed"
    assert result.output == {"echo": request.action.input, "capability": CHILD_CAPABILITY}


async def test_the_prose_after_aip_call_streams_as_after_any_tool_call(
    delegating: ServerUnderTest,
    delegating_client: httpx.AsyncClient,
) -> None:
    run_id = await start_delegated_run(delegating_client, delegated_body(delegation_request()))
    events, _ = await read_events(delegating_client, run_id)

    assert text_of(events) == AFTER_TOOL + str(events[-1]["output"])


async def test_a_failing_aip_call_is_not_retried_and_is_reported_as_failed(
    delegating: ServerUnderTest, delegating_client: httpx.AsyncClient
) -> None:
    # A capability outside the gateway's route table: the call is refused, nothing enqueued.
    request = delegation_request(capability="cap:unrouted:case.get")
    refused_before = await refused_aip_calls(delegating)

    run_id = await start_delegated_run(delegating_client, delegated_body(request))
    events, _ = await read_events(delegating_client, run_id)

    assert delegating.gateway.calls == []
    # Exactly one call reached the gateway (and was refused): Hermes did not retry it.
    assert await refused_aip_calls(delegating) == refused_before + 1
    assert_one_aip_call_then_prose(events, failed=True)
    # A completed run whose prose admits the failure: only the child's result decides.
    assert events[-1]["output"] == delegated_final_text("", True)
    assert (await status_of(delegating_client, run_id))["status"] == "completed"


# --- delegation without it -----------------------------------------------------------------


async def test_without_the_aip_mcp_server_a_delegated_run_is_prose_only(
    plain_hermes: ServerUnderTest, plain_client: httpx.AsyncClient
) -> None:
    if plain_hermes.fake is not None:
        assert AIP_CALL not in plain_hermes.fake.mcp_tools
    body = delegated_body(delegation_request())

    run_id = await start_delegated_run(plain_client, body)
    events, _ = await read_events(plain_client, run_id)

    assert names(events) == ["message.delta", "reasoning.available", "run.completed"]
    assert not any(e["event"].startswith("tool.") for e in events)
    assert events[-1]["output"] == reply_text(body["input"])
    assert (await status_of(plain_client, run_id))["status"] == "completed"
