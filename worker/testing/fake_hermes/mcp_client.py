"""An MCP tool reached over Streamable HTTP, for a fake Hermes running in its own process.

In-process tests register a Python callable in `fake.mcp_tools`; a fake Hermes started as
`python -m worker.testing.fake_hermes --mcp-url URL --mcp-token-file FILE` (the demo's) has
no such callable, so it calls `aip_call` on an MCP server the way the real Hermes does: a
bearer-authenticated Streamable HTTP session, `tools/call aip_call` with the Action's fields
as its arguments, the text content as the result, `isError` as a tool failure.
"""

from __future__ import annotations

from typing import Any

from worker.errors import McpHttpRefused
from worker.gateway.mcp_client import exchange, tool_text
from worker.testing._errors import HarnessError
from worker.testing.fake_hermes.mcp import AIP_CALL, McpTool


class McpRefused(HarnessError, RuntimeError):
    """The MCP server refused the session itself (HTTP status), before any tool ran."""


def remote_aip_call(url: str, token: str) -> McpTool:
    """The `aip_call` tool of the MCP server at `url`, authenticated with `token`."""

    async def aip_call(arguments: dict[str, Any]) -> str:
        async def call(session: Any) -> Any:
            return await session.call_tool(AIP_CALL, arguments)

        try:
            result = await exchange(url, token, call)
        except McpHttpRefused as exc:
            raise McpRefused(f"the MCP server answered HTTP {exc.status}") from None
        text = tool_text(result)
        if result.isError:
            raise RuntimeError(text or "aip_call failed")
        return text

    return aip_call
