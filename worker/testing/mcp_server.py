"""A real MCP server on loopback serving the AIP `aip_call` tool, for the real Hermes to call.

First-class delegation hands Hermes one exact child Action and relies on Hermes' own MCP
client to call `aip_call` with it. The fake Hermes calls the tool in-process
(`fake.mcp_tools`); to prove that fake against the real `hermes-agent==0.19.0`, the same tool
function must be reachable the way a real deployment reaches it: Streamable HTTP, one bearer
token per principal, the token deciding who is calling. This module is that server, built on
the `mcp` SDK's FastMCP (the same SDK version Hermes' `[mcp]` extra pins), so the protocol on
the wire is the real one.

```python
runtime = FakeAipRuntime(nc, seed=seed)
async with AipMcpServer({token: runtime.tool_for(runtime.principal("h1"))}) as server:
    async with RealHermes(tmp, mcp_servers={"aip": (server.url, token)}) as hermes:
        ...  # Hermes discovers the tool at start: the server must already be up
```
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

import uvicorn
from mcp.server.fastmcp import Context, FastMCP
from starlette.types import ASGIApp, Receive, Scope, Send

#: The MCP tool name; Hermes shows it to the model as `mcp__<server name>__aip_call`.
AIP_CALL: Final = "aip_call"
#: The path FastMCP serves Streamable HTTP on.
MCP_PATH: Final = "/mcp"
AIP_CALL_DESCRIPTION: Final = (
    "Create and run one AIP Action on behalf of the calling agent. `arguments` is the exact "
    "Action contract (with `action_id`); the caller's identity comes from its credential."
)

#: The tool function of one authenticated principal: the inner `arguments` object in, the
#: result text out (raising makes the MCP result an error).
McpTool = Callable[[dict[str, Any]], Awaitable[str]]

_STARTUP_TIMEOUT_S: Final = 10.0
_SHUTDOWN_TIMEOUT_S: Final = 10.0
#: Open connections (a client's keep-alive) get this long to finish before they are cut.
_GRACEFUL_SHUTDOWN_S: Final = 2


@dataclass(frozen=True, slots=True)
class McpCall:
    """One `aip_call` as the server received it: who (by token) and the exact arguments."""

    token: str
    arguments: dict[str, Any]


class _Unauthenticated(Exception):
    """The tool ran without a known bearer token (cannot happen behind the 401 gate)."""


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers.

    `Server.serve` replaces the process' SIGINT/SIGTERM handlers while it runs and re-raises
    the signals it caught on exit; inside a test process (or any host that owns its signals)
    Ctrl-C must reach the host, not stop this server behind its back.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bearer(scope: Scope) -> str | None:
    """The token of the request's `Authorization: Bearer …` header, if there is one."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def _new_fastmcp() -> FastMCP:
    # mcp 1.26's Settings model has a forward-referenced field that pydantic-settings 2.16
    # warns about on every construction; it is harmless, and hosts that turn warnings into
    # errors (this project's pytest config, or any `-W error`) must still be able to run it.
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"Field 'lifespan' has an incomplete definition", category=UserWarning
        )
        # Stateless + JSON responses: every tool call is one self-contained POST, so there is
        # no session state to lose and no server-sent stream left open at shutdown.
        return FastMCP(
            "aip", host="127.0.0.1", log_level="WARNING", stateless_http=True, json_response=True
        )


class AipMcpServer:
    """`aip_call` over MCP Streamable HTTP on `127.0.0.1:<free port>/mcp`, bearer-authenticated.

    `tools` maps each accepted bearer token to the tool function of the principal that token
    authenticates (usually `FakeAipRuntime.tool_for(principal)`): the token, not anything in
    the arguments, decides whose tool runs, as the real AIP MCP server does. A request with a
    missing or unknown token is answered `401` before MCP sees it. `tools` stays a live,
    mutable mapping, so a long-lived server (and the Hermes configured with its token) can be
    pointed at a new tool per test. Every call is recorded in `calls`.

    One instance serves once: FastMCP's session manager cannot be started twice.
    """

    def __init__(self, tools: Mapping[str, McpTool]) -> None:
        self.tools: MutableMapping[str, McpTool] = dict(tools)
        self._calls: list[McpCall] = []
        self._port: int | None = None
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._used = False
        self._mcp = _new_fastmcp()

        # Named like the tool, because FastMCP derives the input schema's title from it.
        # The annotation must be the bare class: FastMCP finds the context parameter with
        # `inspect.isclass`, which a parametrized generic is not.
        async def aip_call(arguments: dict[str, Any], ctx: Context) -> str:  # type: ignore[type-arg]
            request = ctx.request_context.request  # the Starlette request of this POST
            token = _bearer(request.scope) if request is not None else None
            return await self._call(token, arguments)

        # Unstructured: the result is exactly the tool's text, as the fake Hermes passes it on.
        self._mcp.add_tool(
            aip_call, name=AIP_CALL, description=AIP_CALL_DESCRIPTION, structured_output=False
        )

    @property
    def port(self) -> int:
        """The bound port (known once started)."""
        if self._port is None:
            raise RuntimeError("AipMcpServer is not started")
        return self._port

    @property
    def url(self) -> str:
        """The Streamable HTTP endpoint, as Hermes' `mcp_servers.<name>.url` wants it."""
        return f"http://127.0.0.1:{self.port}{MCP_PATH}"

    @property
    def calls(self) -> list[McpCall]:
        """Every `aip_call` received so far, oldest first (a copy)."""
        return list(self._calls)

    async def _call(self, token: str | None, arguments: dict[str, Any]) -> str:
        tool = self.tools.get(token) if token is not None else None
        if token is None or tool is None:
            raise _Unauthenticated("no principal is authenticated for this call")
        # A deep copy through JSON: what was received, even if the tool mutates its argument.
        self._calls.append(McpCall(token, json.loads(json.dumps(arguments))))
        return await tool(arguments)

    def _app(self) -> ASGIApp:
        inner = self._mcp.streamable_http_app()  # its lifespan runs the MCP session manager

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                token = _bearer(scope)
                if token is None or token not in self.tools:
                    await _unauthorized(send)
                    return
            await inner(scope, receive, send)

        return app

    async def start(self) -> None:
        """Bind a free loopback port and serve; returns once connections are accepted."""
        if self._used:
            raise RuntimeError("an AipMcpServer serves once; make a new one")
        self._used = True
        # Bound here, not by uvicorn, so the port is known and held before anything starts.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            self._port = int(sock.getsockname()[1])
            config = uvicorn.Config(
                self._app(),
                log_config=None,  # leave the host's logging configuration alone
                log_level="warning",
                access_log=False,
                lifespan="on",
                ws="none",
                timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S,
            )
            server = _QuietServer(config)
            self._server = server
            self._task = asyncio.create_task(server.serve(sockets=[sock]), name="aip-mcp-server")
            async with asyncio.timeout(_STARTUP_TIMEOUT_S):
                while not server.started:
                    if self._task.done():
                        self._task.result()  # raises what broke the startup
                        raise RuntimeError("the MCP server stopped during startup")
                    await asyncio.sleep(0.01)
        except BaseException:
            await self.stop()
            sock.close()
            raise

    async def stop(self) -> None:
        """Stop serving: open connections are closed, then the MCP session manager ends."""
        server, task = self._server, self._task
        self._server = self._task = None
        if server is None or task is None:
            return
        server.should_exit = True
        try:
            await asyncio.wait_for(task, _SHUTDOWN_TIMEOUT_S)
        except TimeoutError:
            server.force_exit = True
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> AipMcpServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def _unauthorized(send: Send) -> None:
    body = b'{"error":"invalid_token","error_description":"unknown or missing bearer token"}'
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer error="invalid_token"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
