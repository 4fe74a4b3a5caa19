"""A client of the AIP gateway's MCP server, as Hermes' own client calls it.

The official `mcp` SDK's Streamable HTTP client over one fresh authenticated session per
call: the qualification driver reads Actions through the gateway with it, and the tests
call the gateway the way Hermes does. A refusal before any tool ran (a 401 for a bad
token, a 403 for missing transport scopes) is `McpHttpRefused` with the status, never the
token.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from worker import tracing
from worker.errors import McpHttpRefused
from worker.gateway.facade import META_KEY

if TYPE_CHECKING:
    from mcp import ClientSession

T = TypeVar("T")

#: Bound on one whole MCP exchange (connect, initialize, call).
CALL_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class ToolAnswer:
    """One tool result: its `structuredContent` (else the JSON document of its text),
    whether it is an error, and the AIP facts of its `_meta["org.getaip/aip"]` (an
    `aip_call`'s `action_id` and error)."""

    is_error: bool
    document: dict[str, Any]
    aip: dict[str, Any] = field(default_factory=dict)

    @property
    def error_code(self) -> str | None:
        error = self.aip.get("error", self.document.get("error"))
        return error.get("code") if isinstance(error, dict) else None

    @property
    def body(self) -> dict[str, Any]:
        """The AIP object of a read tool's answer (`{message_type, body: {key: object}}`)."""
        body = self.document.get("body")
        if isinstance(body, dict) and len(body) == 1:
            (value,) = body.values()
            if isinstance(value, dict):
                return value
        return {}


def _first_status(group: BaseExceptionGroup[Any]) -> int | None:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found = _first_status(exc)
            if found is not None:
                return found
        if isinstance(exc, httpx.HTTPStatusError):
            return exc.response.status_code
    return None


async def exchange(url: str, token: str | None, use: Callable[[ClientSession], Awaitable[T]]) -> T:
    """Open a fresh authenticated session, initialize it, run `use` on it; a refusal of the
    session itself (an HTTP status the SDK wraps in its task group) is `McpHttpRefused`."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    tracing.inject(headers)  # the caller's trace continues at the server (`worker.tracing`)
    try:
        async with (
            httpx.AsyncClient(headers=headers, timeout=CALL_TIMEOUT_S) as http,
            streamable_http_client(url, http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await use(session)
    except BaseExceptionGroup as group:
        status = _first_status(group)
        if status is None:
            raise
        raise McpHttpRefused(status) from None


async def list_tools(url: str, token: str | None) -> list[str]:
    """The tool names the server lists to `token`."""

    async def names(session: ClientSession) -> list[str]:
        return [tool.name for tool in (await session.list_tools()).tools]

    return await exchange(url, token, names)


async def call_tool(
    url: str, token: str | None, tool: str, arguments: Mapping[str, Any] | None = None
) -> ToolAnswer:
    """Call one tool over a fresh authenticated MCP session, as Hermes' client does."""

    async def call(session: ClientSession) -> Any:
        return await session.call_tool(tool, dict(arguments or {}))

    result = await exchange(url, token, call)
    document: Any = result.structuredContent
    if document is None:
        text = tool_text(result)
        try:
            document = json.loads(text)
        except ValueError:
            document = {"text": text}
    if not isinstance(document, dict):
        document = {"value": document}
    meta = (result.meta or {}).get(META_KEY)
    return ToolAnswer(bool(result.isError), document, meta if isinstance(meta, dict) else {})


def tool_text(result: Any) -> str:
    """The text content of a tool result, joined."""
    return "".join(getattr(part, "text", "") for part in result.content)
