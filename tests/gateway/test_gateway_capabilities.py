"""`aip_capabilities` is paged and leaves input schemas out unless asked (issue 27, item 6).

The real gateway process and a real worker serving h1 (fake Hermes), through the MCP SDK's
client as Hermes calls it. The measurement: 112 KB for four endpoints in one answer, which
the real Hermes cut to 1.9 KB before its model saw it.
"""

from __future__ import annotations

import json
from typing import Any

from worker.testing.gateway import call_tool

from .conftest import H1_TOKEN, GatewayStack

MODELS = "cap:hermes_agent:h1:models"


async def _pages(gs: GatewayStack, **arguments: Any) -> tuple[list[dict[str, Any]], int, int]:
    """Every page: the entries, the number of pages and the largest answer's bytes."""
    entries: list[dict[str, Any]] = []
    cursor: int | None = 0
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
    assert [e["capability"] for e in entries] == [e["capability"] for e in everything]
    assert pages == -(-len(everything) // 10)
    assert all("input_schema" not in e and "contract" not in e for e in entries)
    assert all(e["endpoint_id"] == "h1" and "read_only" in e for e in entries)
    lean_bytes = sum(
        len(json.dumps(e)) for e in entries
    )  # what a caller reading every page gets, schemas left out
    assert largest < 16_384, largest
    # One capability's schema, asked for by name.
    one = await call_tool(
        gs.url, H1_TOKEN, "aip_capabilities", {"prefix": MODELS, "include_schemas": True}
    )
    assert [e["capability"] for e in one.document["capabilities"]] == [MODELS]
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
