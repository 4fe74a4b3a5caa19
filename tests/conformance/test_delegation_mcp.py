"""First-class delegation reaches `aip_call` the same way on the fake and the real Hermes 0.19.0.

Spec "Route first-class delegation": Hermes receives the exact child Action as
`aip_call_arguments` and must call `aip_call` exactly once with them. The worker's delegation
tests run against the fake Hermes, which calls the tool in-process (`fake.mcp_tools`); these
tests hold that fake to the real gateway, whose own MCP client calls the same tool function
over Streamable HTTP (`worker.testing.mcp_server.AipMcpServer`, bearer-authenticated as the
delegate). If the real one disagrees, the fake is wrong.

Two real gateways serve this module: one configured with the MCP server, one without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import nats
import pytest
import pytest_asyncio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from schemas.action import DelegationRef, Identity
from schemas.delegation import DELEGATE_PREFIX, ChildAction, DelegationRequest
from schemas.ids import new_action_id
from schemas.lifecycle import LifecycleState
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
from worker.testing.aip_runtime import FakeAipRuntime
from worker.testing.fake_hermes import FakeHermes
from worker.testing.identities import write_trust_files
from worker.testing.mcp_server import AIP_CALL, AipMcpServer, McpCall, McpTool
from worker.testing.real_hermes import HermesUnavailable, RealHermes, ensure_hermes_venv
from worker.testing.scenario import AIP_CALL_TOOL, delegated_final_text, reply_text
from worker.testing.services import ServiceHandle
from worker.trust.signing import TrustedGatewayKeys, verify_envelope

pytestmark = pytest.mark.asyncio(loop_scope="session")

ENDPOINT = "h1"
DELEGATE = DELEGATE_PREFIX + ENDPOINT
CHILD_CAPABILITY = "cap:support_sandbox:case.get"
DELEGATOR = "user:alice"
#: What the simple recording tool answers; JSON, like the AIP runtime's answer.
TOOL_RESULT = json.dumps({"action_id": "act_from_the_tool", "status": "completed"})


# --- builders ------------------------------------------------------------------------------


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def delegation_request() -> DelegationRequest:
    """A valid request whose child uses every kind of JSON value the contract may carry."""
    delegation_id = "dlg-" + secrets.token_hex(8)
    created = now_ms()
    child = ChildAction(
        id=new_action_id(),
        capability=CHILD_CAPABILITY,
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
        conversation={"thread": "t-1"},
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


class RecordingTool:
    """An `aip_call` tool that keeps the arguments of every call and answers TOOL_RESULT."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, arguments: dict[str, Any]) -> str:
        self.calls.append(json.loads(json.dumps(arguments)))
        return TOOL_RESULT


async def _no_tool_yet(arguments: dict[str, Any]) -> str:
    raise RuntimeError("this test did not choose an aip_call tool")


# --- the servers under test ----------------------------------------------------------------


@dataclass
class ServerUnderTest:
    """One Hermes under test; with `aip_call` the fake calls it in-process, the real over MCP."""

    kind: str
    url: str
    api_key: str
    #: The bearer token the real Hermes presents to the MCP server.
    token: str
    fake: FakeHermes | None
    mcp: AipMcpServer | None
    real: RealHermes | None = None

    def use(self, tool: McpTool) -> None:
        """Make `tool` the `aip_call` of the delegate principal (the same function on both)."""
        if self.fake is not None:
            self.fake.mcp_tools[AIP_CALL] = tool
        if self.mcp is not None:
            self.mcp.tools[self.token] = tool


async def _real(
    tmp_path_factory: pytest.TempPathFactory, mcp_servers: dict[str, tuple[str, str]]
) -> AsyncIterator[RealHermes]:
    """A real gateway; a missing venv skips locally and fails under CI (as conftest's)."""
    try:
        await asyncio.to_thread(ensure_hermes_venv)
        workdir = tmp_path_factory.mktemp("real-hermes-mcp" if mcp_servers else "real-hermes")
        async with RealHermes(workdir, mcp_servers=mcp_servers) as real:
            yield real
    except HermesUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the real Hermes is unavailable under CI: {exc.reason}")
        pytest.skip(f"the real Hermes is unavailable: {exc.reason}")


@pytest_asyncio.fixture(scope="module", loop_scope="session", params=["fake", "real"])
async def delegating_hermes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ServerUnderTest]:
    """The server under test with `aip_call` available (parametrized: `fake`, `real`)."""
    token = secrets.token_urlsafe(32)
    if request.param == "real":
        # Hermes lists MCP tools only while its gateway starts: the server comes first.
        async with AipMcpServer({token: _no_tool_yet}) as server:
            async for real in _real(tmp_path_factory, {"aip": (server.url, token)}):
                yield ServerUnderTest("real", real.url, real.api_key, token, None, server, real)
        return
    async with FakeHermes(api_key=secrets.token_urlsafe(32)) as fake:
        fake.mcp_tools[AIP_CALL] = _no_tool_yet
        yield ServerUnderTest("fake", fake.url, fake.api_key, token, fake, None)


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
            yield ServerUnderTest("real", real.url, real.api_key, "", None, None, real)
        return
    async with FakeHermes(api_key=secrets.token_urlsafe(32)) as fake:
        yield ServerUnderTest("fake", fake.url, fake.api_key, "", fake, None)


def _client(server: ServerUnderTest) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    return httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30.0)


@pytest_asyncio.fixture(loop_scope="session")
async def delegating(delegating_hermes: ServerUnderTest) -> AsyncIterator[ServerUnderTest]:
    """The module's server, its tool reset after the test so none leaks into the next."""
    yield delegating_hermes
    delegating_hermes.use(_no_tool_yet)


@pytest_asyncio.fixture(loop_scope="session")
async def delegating_client(delegating: ServerUnderTest) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(delegating) as http:
        yield http


@pytest_asyncio.fixture(loop_scope="session")
async def plain_client(plain_hermes: ServerUnderTest) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(plain_hermes) as http:
        yield http


def assert_one_aip_call_then_prose(events: list[Event], tool_result: str) -> None:
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
    assert completed["error"] is False
    assert isinstance(completed["duration"], float)
    final = delegated_final_text(tool_result, False)
    # The exact deltas are held to the real Hermes by their own test below.
    assert text_of(events).strip() == final
    assert events[-2]["text"] == final
    assert events[-1]["output"] == final


# --- delegation with the AIP MCP server ----------------------------------------------------


async def test_a_delegated_run_calls_aip_call_once_with_the_exact_arguments(
    delegating: ServerUnderTest, delegating_client: httpx.AsyncClient
) -> None:
    tool = RecordingTool()
    delegating.use(tool)
    request = delegation_request()
    body = delegated_body(request)

    run_id = await start_delegated_run(delegating_client, body)
    events, _ = await read_events(delegating_client, run_id)

    expected = aip_call_arguments(request.action)
    assert tool.calls == [expected]
    assert "identity" not in tool.calls[0]
    assert tool.calls[0]["action_id"] == request.action.id
    if delegating.mcp is not None:
        # The real Hermes authenticated as the delegate's token, and nothing else was called.
        assert delegating.mcp.calls == [McpCall(delegating.token, expected)]
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
    assert_one_aip_call_then_prose(events, TOOL_RESULT)
    status = await status_of(delegating_client, run_id)
    assert status["status"] == "completed"
    assert status["output"] == delegated_final_text(TOOL_RESULT, False)


async def test_the_aip_runtime_records_the_delegated_child_it_was_called_for(
    delegating: ServerUnderTest,
    delegating_client: httpx.AsyncClient,
    nats_server: ServiceHandle,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    trust = write_trust_files(tmp_path_factory.mktemp("trust"))
    trusted = TrustedGatewayKeys.load(trust.gateway_keys_file)
    nc = await nats.connect(nats_server.url)
    try:
        runtime = FakeAipRuntime(nc, seed=trust.seed)
        await runtime.provision()
        principal = runtime.principal(ENDPOINT)
        delegating.use(runtime.tool_for(principal))
        request = delegation_request()

        run_id = await start_delegated_run(delegating_client, delegated_body(request))
        events, _ = await read_events(delegating_client, run_id)

        assert runtime.calls == [aip_call_arguments(request.action)]
        stores = JetStreamLifecycleStores(
            nc.jetstream(),
            runtime.subjects,
            lambda data, headers: verify_envelope(data, headers, trusted),
        )
        records = await stores.read(request.action.id)
    finally:
        await nc.close()

    assert records.queue is not None
    assert records.queue.state is LifecycleState.COMPLETED
    assert records.queue.owner_principal_id == DELEGATE
    # The worker's own check accepts what Hermes made the runtime record.
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
    tool_result = json.dumps(
        {"action_id": request.action.id, "status": "completed", "output": result.output}
    )
    assert_one_aip_call_then_prose(events, tool_result)


async def test_the_prose_after_aip_call_streams_as_after_any_tool_call(
    delegating: ServerUnderTest,
    delegating_client: httpx.AsyncClient,
) -> None:
    delegating.use(RecordingTool())

    run_id = await start_delegated_run(delegating_client, delegated_body(delegation_request()))
    events, _ = await read_events(delegating_client, run_id)

    assert text_of(events) == AFTER_TOOL + delegated_final_text(TOOL_RESULT, False)


async def test_a_failing_aip_call_is_not_retried_and_is_reported_as_failed(
    delegating: ServerUnderTest, delegating_client: httpx.AsyncClient
) -> None:
    attempts: list[dict[str, Any]] = []

    async def refusing_tool(arguments: dict[str, Any]) -> str:
        attempts.append(arguments)
        raise RuntimeError("the AIP runtime refused the child")

    delegating.use(refusing_tool)
    request = delegation_request()

    run_id = await start_delegated_run(delegating_client, delegated_body(request))
    events, _ = await read_events(delegating_client, run_id)

    assert attempts == [aip_call_arguments(request.action)]
    assert names(events) == [
        "tool.started",
        "tool.completed",
        "message.delta",
        "reasoning.available",
        "run.completed",
    ]
    assert events[1]["tool"] == AIP_CALL_TOOL
    assert events[1]["error"] is True
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


# --- the harness MCP server itself ---------------------------------------------------------


async def test_the_mcp_server_refuses_a_missing_or_unknown_bearer_token() -> None:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    async with AipMcpServer({"good-token": RecordingTool()}) as server, httpx.AsyncClient() as http:
        missing = await http.post(server.url, json=initialize)
        unknown = await http.post(
            server.url, json=initialize, headers={"Authorization": "Bearer other-token"}
        )
    for response in (missing, unknown):
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert server.calls == []


async def test_the_mcp_server_runs_the_tool_of_the_calling_token() -> None:
    alice, bob = RecordingTool(), RecordingTool()
    arguments = {"action_id": new_action_id(), "input": {"n": [1, None, {"x": "ü"}]}}
    async with AipMcpServer({"alice-token": alice, "bob-token": bob}) as server:
        headers = {"Authorization": "Bearer bob-token"}
        async with (
            httpx.AsyncClient(headers=headers) as http,
            streamable_http_client(server.url, http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
            result = await session.call_tool(AIP_CALL, arguments={"arguments": arguments})

    assert [tool.name for tool in listed.tools] == [AIP_CALL]
    assert result.isError is False
    assert [block.model_dump()["text"] for block in result.content] == [TOOL_RESULT]
    assert result.structuredContent is None
    assert (alice.calls, bob.calls) == ([], [arguments])
    assert server.calls == [McpCall("bob-token", arguments)]
