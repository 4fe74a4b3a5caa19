"""An MCP tool reached over Streamable HTTP, for a fake Hermes running in its own process.

In-process tests register a Python callable in `fake.mcp_tools`; a fake Hermes started as
`python -m worker.testing.fake_hermes --mcp-url URL --mcp-token-file FILE` (the demo's) has
no such callable, so it calls `aip_call` on an MCP server the way the real Hermes does: a
bearer-authenticated Streamable HTTP session, `tools/call aip_call {"arguments": …}`, the
text content as the result, `isError` as a tool failure.
"""

from __future__ import annotations

from typing import Any

import httpx

from worker.testing.fake_hermes.mcp import AIP_CALL, McpTool

CALL_TIMEOUT_S = 60.0


class McpRefused(RuntimeError):
    """The MCP server refused the session itself (HTTP status), before any tool ran."""


def _first(group: BaseExceptionGroup[httpx.HTTPStatusError]) -> httpx.HTTPStatusError:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first(exc)
        return exc
    raise ValueError("empty exception group")


def remote_aip_call(url: str, token: str) -> McpTool:
    """The `aip_call` tool of the MCP server at `url`, authenticated with `token`."""

    async def aip_call(arguments: dict[str, Any]) -> str:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        headers = {"Authorization": f"Bearer {token}"}
        try:
            async with (
                httpx.AsyncClient(headers=headers, timeout=CALL_TIMEOUT_S) as http,
                streamable_http_client(url, http_client=http) as (read, write, _),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                result = await session.call_tool(AIP_CALL, {"arguments": arguments})
        except ExceptionGroup as group:
            # The SDK's task group wraps an HTTP refusal (a 401 for a wrong token).
            refused = group.subgroup(httpx.HTTPStatusError)
            if refused is None:
                raise
            status = _first(refused).response.status_code
            raise McpRefused(f"the MCP server answered HTTP {status}") from None
        text = "".join(getattr(part, "text", "") for part in result.content)
        if result.isError:
            raise RuntimeError(text or "aip_call failed")
        return text

    return aip_call
