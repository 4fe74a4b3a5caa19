"""The real gateway process through a real MCP client: every tool, and the bad-input list.

Real NATS and Redis, a worker process serving endpoint h1 over the fake Hermes, and
`python -m worker gateway`; the client is the official `mcp` SDK's Streamable HTTP client,
as in Hermes. A child is a real Action (`cap:hermes_agent:h1:models`) the worker executes.

The module's tests share one such deployment (conftest's `gs_shared`: servers, worker and
gateway start once per module, not per test), each test seeing it as fresh for what it checks.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio

from schemas.ids import new_action_id
from schemas.lifecycle import LifecycleState
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.aip_wire import receipt_fields
from worker.delegation.stores import JetStreamLifecycleStores, StoreRecords
from worker.errors import McpHttpRefused
from worker.gateway.facade import EXTENSION_KEY
from worker.testing.fake_hermes.faults import RouteDelay
from worker.testing.gateway import ToolAnswer, call_tool, hermes_principal_id, list_tools
from worker.testing.identities import TENANT_A, write_json
from worker.trust.signing import TrustedGatewayKeys

from .conftest import (
    AUDIT_STREAM,
    EXPIRED_TOKEN,
    H1,
    H1_TOKEN,
    OTHER_TENANT_TOKEN,
    OTHER_TOKEN,
    READ_ONLY_TOKEN,
    TENANT_A_TOKEN,
    GatewayStack,
    bus_id,
)

# The module's deployment lives across its tests, so they run on the session's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="session")

MODELS = "cap:hermes_agent:h1:models"
SIX_TOOLS = [
    "aip_capabilities",
    "aip_call",
    "aip_action_status",
    "aip_action_result",
    "aip_action_events",
    "aip_action_cancel",
]
SCHEMA_INVALID = "schema.envelope.invalid"
NOT_FOUND = "connector.hermes_agent.configuration_or_input"


@pytest_asyncio.fixture(loop_scope="session")
async def gs_up(gs_shared: GatewayStack) -> GatewayStack:
    """This module's tests share the module's deployment (conftest `gs_shared`)."""
    return gs_shared


def contract(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "action_id": new_action_id(),
        "capability_id": MODELS,
        "input": {},
        "mode": "sync",
        "timeout_ms": 20_000,
        "idempotency_key": "idem-" + new_action_id()[4:16],
    }
    fields.update(changes)
    return fields


def delegated(delegation: dict[str, Any]) -> dict[str, Any]:
    """The `aip_call` arguments marking a delegated child (our extension, not AIP's)."""
    return {"extensions": {EXTENSION_KEY: {"delegation": delegation}}}


async def aip_call(gs: GatewayStack, token: str, arguments: dict[str, Any]) -> ToolAnswer:
    return await call_tool(gs.url, token, "aip_call", arguments)


async def records(gs: GatewayStack, action_id: str) -> StoreRecords:
    """Both records as a worker reads them: verified against the workers' trusted keys."""
    trusted = TrustedGatewayKeys.load(gs.stack.trust.gateway_keys_file)
    stores = JetStreamLifecycleStores(
        gs.stack.nc.jetstream(),
        gs.stack.subjects,
        trusted,
    )
    return await stores.read(action_id)


async def queue_history(gs: GatewayStack, action_id: str) -> list[str]:
    """Every queue state ever written for a child, in order."""
    messages = await gs.stack.stream_messages(
        "runtime_queue", gs.stack.subjects.runtime_queue(action_id)
    )
    return [msgspec.json.decode(m)["body"]["action_status"]["state"] for m in messages]


async def wait_terminal(gs: GatewayStack, action_id: str, timeout_s: float = 20.0) -> StoreRecords:
    deadline = time.monotonic() + timeout_s
    while True:
        found = await records(gs, action_id)
        if found.queue is not None and found.queue.state.terminal:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{action_id} never terminal: {found}")
        await asyncio.sleep(0.1)


def endpoint_of(capability: dict[str, Any]) -> str:
    """The endpoint of an endpoint-qualified Hermes capability id."""
    return str(capability["id"]).split(":")[2]


def models_reads(gs: GatewayStack) -> int:
    assert gs.stack.fake is not None
    return gs.stack.fake.stats().count("GET /v1/models")


# --- authentication --------------------------------------------------------------------


async def test_a_missing_unknown_or_expired_token_is_401_before_any_tool(
    gs_up: GatewayStack,
) -> None:
    gs = gs_up
    for token in (None, "not-a-known-token", EXPIRED_TOKEN):
        with pytest.raises(McpHttpRefused) as refused:
            await aip_call(gs, token, contract())  # type: ignore[arg-type]
        assert refused.value.status == 401
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    async with httpx.AsyncClient() as http:
        plain = await http.post(gs.url, json=initialize, headers={"Authorization": "Bearer x"})
    assert plain.status_code == 401
    assert plain.headers["www-authenticate"].startswith("Bearer")
    # Nothing was enqueued by any of them.
    assert await gs.enqueued_in_this_test() == []


async def test_exactly_the_six_tools_are_served(gs_up: GatewayStack) -> None:
    assert await list_tools(gs_up.url, H1_TOKEN) == SIX_TOOLS


async def test_a_token_without_the_tools_scope_is_refused_and_nothing_enqueued(
    gs_up: GatewayStack,
) -> None:
    gs = gs_up
    arguments = contract()
    answer = await aip_call(gs, READ_ONLY_TOKEN, arguments)
    assert answer.is_error
    assert answer.error_code == "connector_host.authentication"
    assert "action:write" in answer.document["error"]["message"]
    assert answer.document["error"]["retryable"] is False
    assert (await records(gs, bus_id(arguments))).queue is None
    status = await call_tool(
        gs.url, READ_ONLY_TOKEN, "aip_action_status", {"action_id": arguments["action_id"]}
    )
    assert status.error_code == "connector_host.authentication"
    # capability:read is what this token holds.
    listed = await call_tool(gs.url, READ_ONLY_TOKEN, "aip_capabilities")
    assert not listed.is_error


# --- the tools -------------------------------------------------------------------------


async def test_capabilities_lists_what_the_workers_serve_and_the_routes_admit(
    gs_up: GatewayStack,
) -> None:
    answer = await call_tool(gs_up.url, H1_TOKEN, "aip_capabilities", {"limit": 200})
    assert not answer.is_error, answer.document
    ids = {c["id"] for c in answer.document["capabilities"]}
    assert MODELS in ids
    assert {endpoint_of(c) for c in answer.document["capabilities"]} == {"h1"}


async def test_capabilities_of_an_endpoint_bound_to_a_tenant_are_listed_to_that_tenant_only(
    gs_up: GatewayStack,
) -> None:
    """A second worker serves `ha`, bound to tenant A: it admits only tenant-A Actions, so
    only a tenant-A principal is offered its capabilities; the unbound h1 serves everyone."""
    gs = gs_up
    await provision(
        gs.stack.nc.jetstream(), gs.stack.subjects, ["ha"], StreamPolicy(ack_wait_s=3.0)
    )
    assert gs.stack.fake is not None
    endpoints = write_json(
        gs.stack.root / "endpoints-ha.json",
        [{"id": "ha", "url": gs.stack.fake.url, "tenant_id": TENANT_A}],
        mode=0o600,
    )
    await gs.stack.spawn(
        "w-ha", AIPD_HERMES_ENDPOINTS="", AIPD_HERMES_ENDPOINTS_FILE=str(endpoints)
    )

    async def endpoints_listed(token: str) -> set[str]:
        answer = await call_tool(gs.url, token, "aip_capabilities", {"limit": 200})
        assert not answer.is_error, answer.document
        return {endpoint_of(c) for c in answer.document["capabilities"]}

    tenant_a = await endpoints_listed(TENANT_A_TOKEN)
    assert tenant_a == {"h1", "ha"}
    listed = await call_tool(gs.url, TENANT_A_TOKEN, "aip_capabilities", {"limit": 200})
    bound = [c for c in listed.document["capabilities"] if endpoint_of(c) == "ha"]
    assert "cap:hermes_agent:ha:models" in {c["id"] for c in bound}
    # Tenant B, and a principal without a tenant, are refused by `ha`: never offered it.
    assert await endpoints_listed(OTHER_TENANT_TOKEN) == {"h1"}
    assert await endpoints_listed(H1_TOKEN) == {"h1"}


async def test_a_sync_call_runs_the_child_on_the_bus_and_settles_both_records_in_order(
    gs_up: GatewayStack,
) -> None:
    gs = gs_up
    arguments = contract()
    child_id = bus_id(arguments)
    answer = await aip_call(gs, H1_TOKEN, arguments)
    assert not answer.is_error, answer.document
    # The caller names its Action by its own id; the bus id is namespaced to the caller.
    assert answer.aip["action_id"] == arguments["action_id"]
    assert answer.aip["status"] == "completed"
    result = {"status": "completed", "output": answer.document}
    assert result["output"]["data"][0]["id"] == "hermes-agent"
    # The records a worker's resolver reads: signed by a key the workers trust.
    found = await records(gs, child_id)
    assert found.queue is not None
    assert found.lifecycle is not None
    assert found.queue.state is LifecycleState.COMPLETED
    assert found.queue.owner_principal_id == H1
    assert found.queue.authenticated.principal_id == H1
    assert found.queue.action.identity.principal_id == H1
    assert found.lifecycle.result is not None
    assert found.lifecycle.result.output == result["output"]
    assert await queue_history(gs, child_id) == ["queued", "running", "completed"]
    # The worker executed the exact child once, and settled it under its id.
    native = await gs.stack.client.handle("h1", child_id).result(timeout_s=5)
    assert native.settled_by == "w1"
    assert models_reads(gs) == 1
    # status, result, events of the caller's own Action.
    own = {"action_id": arguments["action_id"]}
    status = await call_tool(gs.url, H1_TOKEN, "aip_action_status", own)
    assert status.body["state"] == "completed"
    stored = await call_tool(gs.url, H1_TOKEN, "aip_action_result", own)
    assert stored.body == {**own, **result}
    events = await call_tool(gs.url, H1_TOKEN, "aip_action_events", own)
    assert not events.is_error, events.document
    # `models` does not stream: no chunk, and the signed result (naming none) ends it.
    assert events.body["terminal"] is True
    assert events.body["events"] == []
    assert "cursor" not in events.body  # an ended Action's last page: nothing after it
    later = await call_tool(gs.url, H1_TOKEN, "aip_action_events", {**own, "cursor": "0"})
    assert later.body["events"] == []
    # Receipts: the gateway's tool calls beside the worker's own, on the child's chain.
    receipts = await gs.stack.client.receipts("h1", child_id)
    tools = [r.details.get("tool") for r in receipts if r.event.value == "tool_call"]
    assert tools[:1] == ["aip_call"]
    assert {"aip_action_status", "aip_action_result", "aip_action_events"} <= set(tools)
    assert all(
        r.details["principal_id"] == H1 and r.details["decision"] == "allowed"
        for r in receipts
        if r.event.value == "tool_call"
    )
    assert {"received", "settled"} <= {r.event.value for r in receipts}
    # The gateway signs its receipts: `audit` (trusting its key) keeps them in the chain.
    chain = await gs.stack.client.audit_chain(
        "h1",
        child_id,
        trusted_gateway_keys=TrustedGatewayKeys.load(gs.stack.trust.gateway_keys_file),
    )
    assert chain.unverified == []
    assert "tool_call" in {e.receipt.event.value for e in chain.entries}


async def test_an_async_call_answers_at_once_and_the_result_follows(gs_up: GatewayStack) -> None:
    gs = gs_up
    arguments = contract(mode="async")
    answer = await aip_call(gs, H1_TOKEN, arguments)
    assert not answer.is_error, answer.document
    assert answer.document["action_id"] == arguments["action_id"]
    assert answer.document["ack"]["status"] in ("queued", "accepted")
    await wait_terminal(gs, bus_id(arguments))
    stored = await call_tool(
        gs.url, H1_TOKEN, "aip_action_result", {"action_id": arguments["action_id"]}
    )
    assert stored.body["status"] == "completed"


async def test_without_an_action_id_the_gateway_assigns_one(gs_up: GatewayStack) -> None:
    arguments = contract()
    del arguments["action_id"]
    answer = await aip_call(gs_up, H1_TOKEN, arguments)
    assert not answer.is_error, answer.document
    assert answer.aip["action_id"].startswith("act_")
    assert answer.aip["status"] == "completed"
    # The id it assigned is the caller's to use with the other tools.
    status = await call_tool(
        gs_up.url, H1_TOKEN, "aip_action_status", {"action_id": answer.aip["action_id"]}
    )
    assert status.body["state"] == "completed"


async def test_the_same_action_id_and_contract_returns_the_same_child_without_a_second_run(
    gs_up: GatewayStack,
) -> None:
    gs = gs_up
    arguments = contract()
    first = await aip_call(gs, H1_TOKEN, arguments)
    again = await aip_call(gs, H1_TOKEN, arguments)
    assert not again.is_error, again.document
    assert again.aip["action_id"] == first.aip["action_id"] == arguments["action_id"]
    assert again.aip["duplicate"] is True
    assert again.document == first.document
    assert models_reads(gs) == 1
    assert await queue_history(gs, bus_id(arguments)) == ["queued", "running", "completed"]


async def test_the_same_action_id_with_another_contract_is_a_collision(
    gs_up: GatewayStack,
) -> None:
    gs = gs_up
    arguments = contract()
    await aip_call(gs, H1_TOKEN, arguments)
    changed = {**arguments, "idempotency_key": "another-key"}
    answer = await aip_call(gs, H1_TOKEN, changed)
    assert answer.is_error
    assert answer.error_code == NOT_FOUND
    assert "idempotency collision" in answer.document["error"]["message"]
    assert models_reads(gs) == 1
    assert await queue_history(gs, bus_id(arguments)) == ["queued", "running", "completed"]
    # Another principal naming the same id gets a child of its own: ids are namespaced per
    # principal, so it neither collides with nor learns anything about the first.
    other = await aip_call(gs, OTHER_TOKEN, arguments)
    assert not other.is_error, other.document
    theirs = bus_id(arguments, hermes_principal_id("h2"))
    assert theirs != bus_id(arguments)
    assert (await records(gs, theirs)).queue is not None
    assert models_reads(gs) == 2


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("identity", SCHEMA_INVALID),
        ("unknown_field", SCHEMA_INVALID),
        ("id_field", SCHEMA_INVALID),
        ("oversized", SCHEMA_INVALID),
        ("unrouted", "connector_host.route_mismatch"),
        ("unserved_endpoint", "connector_host.route_mismatch"),
        ("bad_operation", SCHEMA_INVALID),
        ("not_an_aip_conversation", SCHEMA_INVALID),
    ],
)
async def test_bad_input_is_refused_with_a_typed_error_and_nothing_is_sent(
    gs_up: GatewayStack, case: str, code: str
) -> None:
    gs = gs_up
    arguments = contract()
    if case == "identity":
        arguments["identity"] = {"principal_id": "user:root", "principal_kind": "user"}
    elif case == "unknown_field":
        arguments["surprise"] = True
    elif case == "id_field":
        arguments["id"] = new_action_id()
    elif case == "oversized":
        arguments["input"] = {"blob": "x" * 4096}
    elif case == "unrouted":
        arguments["capability_id"] = "cap:billing:invoice.pay"
    elif case == "unserved_endpoint":
        # Routed by the built-in Hermes route, but no worker pool provisioned endpoint h8.
        arguments["capability_id"] = "cap:hermes_agent:h8:models"
    elif case == "bad_operation":
        arguments["capability_id"] = "cap:hermes_agent:h1:Not-An-Operation"
    elif case == "not_an_aip_conversation":
        # The child travels as an AIP Action Envelope: `conversation` is AIP's, closed.
        arguments["conversation"] = {"thread": "t-1"}
    answer = await aip_call(gs, H1_TOKEN, arguments)
    assert answer.is_error
    assert answer.error_code == code, answer.document
    error = answer.document["error"]
    assert error["retryable"] is False
    assert error["uncertain_outcome"] is False
    assert (await records(gs, bus_id(arguments))).queue is None
    assert models_reads(gs) == 0
    receipts = await gs.stored_in_this_test(AUDIT_STREAM, "aip.hermes.*.audit.*")
    decisions = [receipt_fields(r)["details"].get("decision") for r in receipts]
    assert code in decisions


async def test_another_principals_or_tenants_action_is_invisible(gs_up: GatewayStack) -> None:
    gs = gs_up
    arguments = contract()
    await aip_call(gs, H1_TOKEN, arguments)
    child_id = bus_id(arguments)
    for token in (OTHER_TOKEN, OTHER_TENANT_TOKEN):
        for tool, extra in (
            ("aip_action_status", {}),
            ("aip_action_result", {}),
            ("aip_action_events", {}),
            ("aip_action_cancel", {"reason": "not mine"}),
        ):
            answer = await call_tool(gs.url, token, tool, {"action_id": child_id, **extra})
            assert answer.is_error, (tool, answer.document)
            assert answer.error_code == NOT_FOUND
            assert "no Action" in answer.document["error"]["message"]
            # The same answer as for an id that does not exist at all.
            missing = await call_tool(gs.url, token, tool, {"action_id": new_action_id(), **extra})
            assert missing.document["error"]["message"].replace(
                missing.document["error"]["message"].split()[2], "X"
            ) == answer.document["error"]["message"].replace(child_id, "X")


async def test_cancel_reaches_the_executor_of_a_running_child(gs_up: GatewayStack) -> None:
    gs = gs_up
    assert gs.stack.fake is not None
    gs.stack.fake.faults.add(RouteDelay(route="GET /v1/models", delay_s=8.0))
    arguments = contract(mode="async")
    await aip_call(gs, H1_TOKEN, arguments)
    child_id = bus_id(arguments)
    await asyncio.sleep(0.5)
    answer = await call_tool(
        gs.url, H1_TOKEN, "aip_action_cancel", {"action_id": child_id, "reason": "changed mind"}
    )
    assert not answer.is_error, answer.document
    # The executor answers the AIP Cancel with the child's result once it is cancelled.
    assert answer.aip["cancel"]["accepted"] is True
    assert answer.aip["cancel"]["executor_status"] == "cancelled"
    if answer.document["message_type"] == "aip.core.v1.action_result":
        assert answer.body["status"] == "cancelled"
    found = await wait_terminal(gs, child_id)
    assert found.queue is not None
    assert found.queue.state is LifecycleState.CANCELLED
    assert found.lifecycle is not None
    assert found.lifecycle.state is LifecycleState.CANCELLED


async def test_a_worker_that_never_answers_is_bounded_by_the_childs_timeout(
    gs_up: GatewayStack,
) -> None:
    gs = gs_up
    # Endpoint h9 is provisioned (its work queue takes the child), but no worker serves it.
    await provision(
        gs.stack.nc.jetstream(), gs.stack.subjects, ["h9"], StreamPolicy(ack_wait_s=3.0)
    )
    arguments = contract(capability_id="cap:hermes_agent:h9:models", timeout_ms=1_500)
    started = time.monotonic()
    answer = await aip_call(gs, H1_TOKEN, arguments)
    assert time.monotonic() - started < 10
    assert not answer.is_error, answer.document
    assert answer.document["ack"]["status"] == "accepted"
    # Past the timeout plus the settle grace, the sweep settles it failed, uncertain.
    found = await wait_terminal(gs, bus_id(arguments), timeout_s=15)
    assert found.lifecycle is not None
    assert found.lifecycle.result is not None
    error = found.lifecycle.result.error
    assert error is not None
    assert error["code"] == "connector.hermes_agent.deadline_exceeded"
    assert error["uncertain_outcome"] is True


def sample(metrics: str, series: str) -> float:
    """The value of one series in a Prometheus exposition (0 when it is not there yet)."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def test_health_ready_and_metrics(gs_up: GatewayStack) -> None:
    allowed = 'aip_gateway_tool_calls_total{decision="allowed",tool="aip_capabilities"}'
    refused = 'aip_gateway_tool_calls_total{decision="refused",tool="aip_action_status"}'
    async with httpx.AsyncClient(base_url=gs_up.base_url) as http:
        assert (await http.get("/health")).json() == {"alive": True}
        ready = await http.get("/ready")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"nats_connected": True, "runtime_stores": True}
        before = (await http.get("/metrics")).text
        await call_tool(gs_up.url, H1_TOKEN, "aip_capabilities")
        await call_tool(
            gs_up.url, READ_ONLY_TOKEN, "aip_action_status", {"action_id": new_action_id()}
        )
        metrics = (await http.get("/metrics")).text
    # The gateway counted this test's two calls (it served the module's earlier tests too).
    assert allowed in metrics
    assert refused in metrics
    assert sample(metrics, allowed) == sample(before, allowed) + 1
    assert sample(metrics, refused) == sample(before, refused) + 1
