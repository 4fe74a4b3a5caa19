"""`aip_capabilities` is paged and leaves input schemas out unless asked (issue 27, item 6).

The real gateway process and a real worker serving h1 (fake Hermes), through the MCP SDK's
client as Hermes calls it. The measurement: 112 KB for four endpoints in one answer, which
the real Hermes cut to 1.9 KB before its model saw it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nats

from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from worker.testing.gateway import call_tool

from .conftest import H1_TOKEN, GatewayStack
from .test_gateway_tools import endpoint_of

MODELS = "cap:hermes_agent:h1:models"
#: The issue's case: four endpoints (h1 from the stack's worker, these from a second one).
MORE_ENDPOINTS = ("h2", "h3", "h4")


async def _pages(gs: GatewayStack, **arguments: Any) -> tuple[list[dict[str, Any]], int, int]:
    """Every page: the entries, the number of pages and the largest answer's bytes."""
    entries: list[dict[str, Any]] = []
    cursor: str | None = "0"
    pages = 0
    largest = 0
    while cursor is not None:
        answer = await call_tool(
            gs.url, H1_TOKEN, "aip_capabilities", {"cursor": cursor, **arguments}
        )
        assert not answer.is_error, answer.document
        document = answer.document
        largest = max(largest, len(json.dumps(document)))
        entries += document["capabilities"]
        assert document["total"] >= len(entries)
        cursor = document["next_cursor"]
        pages += 1
        assert pages < 100
    return entries, pages, largest


async def test_capabilities_are_paged_and_schemas_come_only_when_asked(
    gs_up: GatewayStack,
) -> None:
    gs = gs_up
    whole = await call_tool(
        gs.url, H1_TOKEN, "aip_capabilities", {"limit": 200, "include_schemas": True}
    )
    everything = whole.document["capabilities"]
    assert whole.document["next_cursor"] is None
    assert all("input_schema" in entry for entry in everything)
    full_bytes = len(json.dumps(whole.document))

    entries, pages, largest = await _pages(gs, limit=10)
    assert [e["id"] for e in entries] == [e["id"] for e in everything]
    assert pages == -(-len(everything) // 10)
    assert all("input_schema" not in e and "contract" not in e for e in entries)
    assert all(endpoint_of(e) == "h1" and "risk" in e and e["bindings"] for e in entries)
    lean_bytes = sum(
        len(json.dumps(e)) for e in entries
    )  # what a caller reading every page gets, schemas left out
    assert largest < 16_384, largest
    # One capability's schema, asked for by name.
    one = await call_tool(
        gs.url, H1_TOKEN, "aip_capabilities", {"capability_id": MODELS, "include_schemas": True}
    )
    assert [e["id"] for e in one.document["capabilities"]] == [MODELS]
    assert "input_schema" in one.document["capabilities"][0]
    print(
        f"aip_capabilities, one endpoint, {len(everything)} capabilities: "
        f"{full_bytes} bytes with schemas in one answer; {lean_bytes} bytes without, "
        f"pages of 10 at most {largest} bytes"
    )


async def test_a_bad_page_is_refused_with_a_typed_error(gs_up: GatewayStack) -> None:
    answer = await call_tool(gs_up.url, H1_TOKEN, "aip_capabilities", {"limit": 0})
    assert answer.is_error
    assert answer.error_code == "schema.envelope.invalid"


async def test_four_endpoints_list_in_small_default_pages(gstack: GatewayStack) -> None:
    """The measured case: four endpoints were 112 KB in one answer (the real Hermes cut it
    to 1.9 KB). Now the default page (20 entries, no schemas) stays a few KB."""
    gs = gstack
    nc = await nats.connect(gs.stack.nats_url)
    try:
        await provision(
            nc.jetstream(), Subjects(), ["h1", *MORE_ENDPOINTS], StreamPolicy(ack_wait_s=3.0)
        )
    finally:
        await nc.close()
    url = gs.stack.env["AIPD_HERMES_ENDPOINTS"].split("=", 1)[1]
    await gs.stack.spawn(
        "w234",
        AIPD_HERMES_ENDPOINTS=",".join(f"{e}={url}" for e in MORE_ENDPOINTS),
        AIPD_HERMES_SHARED_ENDPOINTS=",".join(MORE_ENDPOINTS),
        AIPD_HERMES_SHARE_API_KEY="true",
    )
    await gs.start_gateway("g4")
    deadline = time.monotonic() + 30
    while True:
        whole = await call_tool(
            gs.url, H1_TOKEN, "aip_capabilities", {"limit": 200, "include_schemas": True}
        )
        endpoints = {endpoint_of(e) for e in whole.document["capabilities"]}
        if endpoints == {"h1", *MORE_ENDPOINTS} or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert endpoints == {"h1", *MORE_ENDPOINTS}
    assert whole.document["next_cursor"] is None
    full_bytes = len(json.dumps(whole.document))
    first = await call_tool(gs.url, H1_TOKEN, "aip_capabilities", {})
    assert len(first.document["capabilities"]) == 20
    assert first.document["next_cursor"] == "20"
    default_bytes = len(json.dumps(first.document))
    entries, pages, largest = await _pages(gs)
    assert len(entries) == len(whole.document["capabilities"])
    # The bound: a default page is a small fraction of what Hermes cut at 1.9 KB of 112 KB.
    assert largest < 12_288, largest
    print(
        f"aip_capabilities, four endpoints, {len(entries)} capabilities: {full_bytes} bytes "
        f"with schemas in one answer; default pages of 20: {pages} pages, the first "
        f"{default_bytes} bytes, the largest {largest} bytes"
    )
