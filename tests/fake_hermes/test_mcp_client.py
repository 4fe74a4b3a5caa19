"""The fake Hermes's remote `aip_call`: a real MCP client session against the harness server."""

from __future__ import annotations

from typing import Any

import pytest

from worker.testing.fake_hermes.mcp_client import McpRefused, remote_aip_call
from worker.testing.mcp_server import AipMcpServer

TOKEN = "mcp-token-0123456789abcdef"


async def test_the_exact_arguments_reach_the_tool_of_the_token_and_its_text_comes_back() -> None:
    seen: list[dict[str, Any]] = []

    async def tool(arguments: dict[str, Any]) -> str:
        seen.append(arguments)
        return '{"status": "completed"}'

    arguments = {"action_id": "act_" + "a" * 32, "input": {"nested": [1, "two", None]}}
    async with AipMcpServer({TOKEN: tool}) as server:
        text = await remote_aip_call(server.url, TOKEN)(arguments)
    assert text == '{"status": "completed"}'
    assert seen == [arguments]


async def test_a_failing_tool_and_a_wrong_token_are_errors() -> None:
    async def tool(arguments: dict[str, Any]) -> str:
        raise RuntimeError("refused by the runtime")

    async with AipMcpServer({TOKEN: tool}) as server:
        with pytest.raises(RuntimeError, match="refused by the runtime"):
            await remote_aip_call(server.url, TOKEN)({"action_id": "x"})
        with pytest.raises(McpRefused, match="HTTP 401"):
            await remote_aip_call(server.url, "wrong-token")({"action_id": "x"})
