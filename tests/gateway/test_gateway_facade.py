"""The six MCP tools take and return the reference facade's shapes (upstream aip-mcp-server,
shared/reference/aip-1.0-wire.md §6.1; issue #26 item 4).

The reference argument names and types are stated here by hand, not imported from the
project; the answers are checked against the exported AIP JSON Schemas (`schemas/json/`)
with jsonschema, or by hand where AIP exports no schema (ActionEvents). Real NATS, Redis,
worker and gateway processes (the `gs_up` stack, shared by the module's tests: conftest's
`gs_shared`), the official MCP client.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import pytest_asyncio

from schemas.ids import new_action_id
from worker.gateway.mcp_client import exchange
from worker.testing.gateway import call_tool

from .conftest import H1_TOKEN, GatewayStack

# The module's deployment lives across its tests, so they run on the session's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="session")

MODELS = "cap:hermes_agent:h1:models"
CHAT_STREAM = "cap:hermes_agent:h1:chat_stream"
SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")

@pytest_asyncio.fixture(loop_scope="session")
async def gs_up(gs_shared: GatewayStack) -> GatewayStack:
    """This module's tests share the module's deployment (conftest `gs_shared`)."""
    return gs_shared


#: The reference tools' arguments (name -> JSON type), and which are required.
REFERENCE: dict[str, tuple[dict[str, str | None], set[str]]] = {
    "aip_capabilities": (
        {
            "capability_id": "string",
            "profile": "string",
            "query": "string",
            "include_schemas": "boolean",
            "include_contracts": "boolean",
            "include_bindings": "boolean",
            "cursor": "string",
            "limit": "integer",
        },
        set(),
    ),
    "aip_call": (
        {
            "capability_id": "string",
            "input": None,  # any JSON value
            "action_id": "string",
            "mode": "string",
            "idempotency_key": "string",
            "timeout_ms": "integer",
            "conversation": "object",
            "memory_context": None,
            "delegation_chain": "array",
            "federation": "object",
            "callback": "object",
            "observability": "object",
            "compliance": "object",
            "approval": "object",
            "transaction": "object",
            "context": "object",
        },
        {"capability_id"},
    ),
    "aip_action_status": (
        {
            "action_id": "string",
            "tenant_id": "string",
            "include_result": "boolean",
            "include_receipts": "boolean",
            "include_chunks": "boolean",
            "wait_ms": "integer",
        },
        {"action_id"},
    ),
    "aip_action_result": (
        {
            "action_id": "string",
            "tenant_id": "string",
            "wait_ms": "integer",
            "include_receipt": "boolean",
            "include_terminal_events": "boolean",
        },
        {"action_id"},
    ),
    "aip_action_events": (
        {
            "action_id": "string",
            "tenant_id": "string",
            "cursor": "string",
            "limit": "integer",
            "kinds": "array",
            "kind": "string",
            "include_chunks": "boolean",
            "follow": "boolean",
        },
        {"action_id"},
    ),
    "aip_action_cancel": ({"action_id": "string", "reason": "string"}, {"action_id"}),
}
#: What this gateway adds to the reference arguments (our Envelope extension facts).
OURS = {"aip_call": {"extensions"}}


def aip_type(file: str, definition: str) -> jsonschema.Draft202012Validator:
    """A validator of one AIP type from an exported Envelope schema's `$defs`."""
    document = json.loads((SCHEMAS / f"{file}.json").read_text())
    schema = {"$ref": f"#/$defs/{definition}", "$defs": document["$defs"]}
    return jsonschema.Draft202012Validator(schema)


def valid(validator: jsonschema.Draft202012Validator, instance: Any) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(instance)]
    assert errors == [], (errors, instance)


async def test_tools_list_gives_each_tool_the_reference_arguments(gs_up: GatewayStack) -> None:
    async def listed(session: Any) -> Any:
        return (await session.list_tools()).tools

    tools = {tool.name: tool for tool in await exchange(gs_up.url, H1_TOKEN, listed)}
    assert set(tools) == set(REFERENCE)
    for name, (arguments, required) in REFERENCE.items():
        schema = tools[name].inputSchema
        assert schema["type"] == "object", name
        assert set(schema["properties"]) - OURS.get(name, set()) == set(arguments), name
        assert set(schema.get("required", [])) == required, name
        for argument, kind in arguments.items():
            declared = schema["properties"][argument].get("type")
            assert declared == kind, (name, argument, declared)
        # The schema is closed: a model reading it knows every field there is.
        assert schema["additionalProperties"] is False, name
        assert tools[name].description
    assert tools["aip_call"].inputSchema["properties"]["mode"]["enum"] == [
        "sync",
        "async",
        "streaming",
    ]
    assert tools["aip_action_status"].inputSchema["properties"]["wait_ms"]["maximum"] == 30_000


async def test_reference_shaped_calls_answer_aip_objects(gs_up: GatewayStack) -> None:
    gs = gs_up
    status_of = aip_type("aip.lifecycle.v1.action_status", "ActionStatus")
    result_of = aip_type("aip.core.v1.action_result", "ActionResult")
    chunk_of = aip_type("aip.lifecycle.v1.action_status", "StreamChunk")
    action_id = new_action_id()

    # aip_call: the Action's fields at the top level; `context` carries one of them.
    call = await call_tool(
        gs.url,
        H1_TOKEN,
        "aip_call",
        {
            "capability_id": MODELS,
            "input": {},
            "action_id": action_id,
            "mode": "sync",
            "context": {"timeout_ms": 20_000},
        },
    )
    assert not call.is_error, call.document
    assert call.aip["action_id"] == action_id
    assert call.aip["status"] == "completed"
    assert call.document["data"][0]["id"] == "hermes-agent"  # the output, as structuredContent

    status = await call_tool(
        gs.url,
        H1_TOKEN,
        "aip_action_status",
        {"action_id": action_id, "include_result": True, "include_chunks": True, "wait_ms": 0},
    )
    assert not status.is_error, status.document
    assert status.document["message_type"] == "aip.lifecycle.v1.action_status"
    action_status = status.document["body"]["action_status"]
    valid(status_of, action_status)
    assert action_status["action_id"] == action_id
    assert action_status["state"] == "completed"
    assert action_status["capability_id"] == MODELS
    assert RFC3339.match(action_status["updated_at"])
    valid(result_of, action_status["result"])

    result = await call_tool(
        gs.url, H1_TOKEN, "aip_action_result", {"action_id": action_id, "wait_ms": 1000}
    )
    assert result.document["message_type"] == "aip.core.v1.action_result"
    action_result = result.document["body"]["action_result"]
    valid(result_of, action_result)
    assert action_result["action_id"] == action_id
    assert action_result["status"] == "completed"
    assert action_result["output"] == call.document

    events = await call_tool(
        gs.url,
        H1_TOKEN,
        "aip_action_events",
        {"action_id": action_id, "cursor": "0", "limit": 1000, "include_chunks": True},
    )
    assert events.document["message_type"] == "aip.lifecycle.v1.action_events"
    page = events.document["body"]["action_events"]
    assert set(page) <= {"action_id", "events", "chunks", "cursor", "terminal"}
    assert page["action_id"] == action_id
    assert page["terminal"] is True
    assert "cursor" not in page  # the ended Action's last page was given
    # `models` does not stream (as upstream AIP): no event and no chunk; its result ended it.
    assert page["events"] == []
    assert "chunks" not in page

    # The events' shapes and the kinds filter, on a streaming capability's Action.
    streamed_id = new_action_id()
    streamed = await call_tool(
        gs.url,
        H1_TOKEN,
        "aip_call",
        {
            "capability_id": CHAT_STREAM,
            "input": {"messages": [{"role": "user", "content": "stream me a reply"}]},
            "action_id": streamed_id,
            "mode": "streaming",
            "idempotency_key": "idem-" + streamed_id[4:24],
            "context": {"timeout_ms": 20_000},
        },
    )
    assert not streamed.is_error, streamed.document
    ended = await call_tool(
        gs.url, H1_TOKEN, "aip_action_result", {"action_id": streamed_id, "wait_ms": 20_000}
    )
    assert ended.document["body"]["action_result"]["status"] == "completed", ended.document
    events = await call_tool(
        gs.url,
        H1_TOKEN,
        "aip_action_events",
        {"action_id": streamed_id, "cursor": "0", "limit": 1000, "include_chunks": True},
    )
    page = events.document["body"]["action_events"]
    assert page["terminal"] is True
    assert "cursor" not in page
    assert len(page["events"]) >= 2, page  # the reply's chunks, then done
    for event in page["events"]:
        assert re.fullmatch(r"evt_[0-9a-f]{32}", event["id"]), event
        assert event["kind"] == f"stream_chunk.{event['data']['kind']}"
        assert RFC3339.match(event["occurred_at"]), event
        assert event["action_id"] == streamed_id
    assert len(page["chunks"]) == len(page["events"])
    for chunk in page["chunks"]:
        valid(chunk_of, chunk)
    only_done = await call_tool(
        gs.url,
        H1_TOKEN,
        "aip_action_events",
        {"action_id": streamed_id, "kinds": ["stream_chunk.done"]},
    )
    assert [e["kind"] for e in only_done.body["events"]] == ["stream_chunk.done"]

    # Cancelling an Action that already ended answers how it ended: its ActionResult.
    cancel = await call_tool(
        gs.url, H1_TOKEN, "aip_action_cancel", {"action_id": action_id, "reason": "late"}
    )
    assert not cancel.is_error, cancel.document
    valid(result_of, cancel.body)
    assert cancel.body["status"] == "completed"

    # An asynchronous call answers `{action_id, ack}` at once.
    queued = new_action_id()
    ack = await call_tool(
        gs.url,
        H1_TOKEN,
        "aip_call",
        {"capability_id": MODELS, "action_id": queued, "mode": "async"},
    )
    assert not ack.is_error, ack.document
    assert ack.document["action_id"] == queued
    assert ack.document["ack"]["action_id"] == queued
    assert ack.document["ack"]["status"] in ("queued", "accepted")
    ended = await call_tool(
        gs.url, H1_TOKEN, "aip_action_result", {"action_id": queued, "wait_ms": 20_000}
    )
    valid(result_of, ended.body)


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("aip_call", {"input": {}}, "capability_id"),
    ("aip_call", {"capability": MODELS}, "capability"),
    ("aip_call", {"arguments": {"capability_id": MODELS}}, "arguments"),
    ("aip_call", {"capability_id": MODELS, "mode": "stream"}, "mode"),
    ("aip_call", {"capability_id": MODELS, "timeout_ms": "soon"}, "timeout_ms"),
    ("aip_call", {"capability_id": MODELS, "action_id": "mine"}, "action_id"),
    ("aip_call", {"capability_id": MODELS, "context": 7}, "context"),
    ("aip_call", {"capability_id": MODELS, "identity": {"id": "user:root"}}, "identity"),
    ("aip_call", {"capability_id": MODELS, "delegation_chain": [{}]}, "delegation_chain"),
    ("aip_action_status", {}, "action_id"),
    ("aip_action_status", {"action_id": new_action_id(), "wait_ms": 60_000}, "wait_ms"),
    ("aip_action_status", {"action_id": new_action_id(), "include_receipts": True}, "receipts"),
    ("aip_action_result", {"action_id": 5}, "action_id"),
    ("aip_action_events", {"action_id": new_action_id(), "cursor": 3}, "cursor"),
    ("aip_action_events", {"action_id": new_action_id(), "kinds": "done"}, "kinds"),
    ("aip_action_events", {"action_id": new_action_id(), "limit": 5000}, "limit"),
    ("aip_action_cancel", {"action_id": new_action_id(), "reason": ["x"]}, "reason"),
    ("aip_capabilities", {"prefix": MODELS}, "prefix"),
    ("aip_capabilities", {"cursor": "-1"}, "cursor"),
    ("aip_capabilities", {"limit": 0}, "limit"),
]


@pytest.mark.parametrize("cases", [BAD], ids=["all"])
async def test_bad_arguments_are_clear_tool_errors_and_the_gateway_goes_on(
    gs_up: GatewayStack, cases: list[tuple[str, dict[str, Any], str]]
) -> None:
    for tool, arguments, named in cases:
        answer = await call_tool(gs_up.url, H1_TOKEN, tool, arguments)
        assert answer.is_error, (tool, arguments, answer.document)
        assert answer.error_code == "schema.envelope.invalid", (tool, arguments, answer.document)
        message = answer.document["error"]["message"]
        assert named in message, (tool, arguments, message)
        assert answer.document["error"]["retryable"] is False
    unknown = await call_tool(gs_up.url, H1_TOKEN, "aip_delegate", {"capability_id": MODELS})
    assert unknown.is_error
    assert "aip_delegate" in unknown.document["error"]["message"]
    # Nothing was enqueued, and the gateway still serves.
    assert await gs_up.enqueued_in_this_test() == []
    listed = await call_tool(gs_up.url, H1_TOKEN, "aip_capabilities", {"capability_id": MODELS})
    assert [c["id"] for c in listed.document["capabilities"]] == [MODELS]
