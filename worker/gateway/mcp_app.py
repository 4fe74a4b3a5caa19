"""The HTTP face of the gateway: the MCP server (Streamable HTTP, `/mcp`) and `/health`,
`/ready`, `/metrics`, as one ASGI app served by uvicorn.

Built on the official `mcp` SDK's FastMCP (the version `hermes-agent[mcp]` pins), so the
protocol on the wire is the one Hermes' client speaks. Authentication happens in front of
MCP: a request to `/mcp` without a present, known and unexpired bearer token is answered
401 before the SDK sees it (no session, no tool listing, no tool run); a token without the
transport scopes gets 403. Each tool then authenticates the call's own token again (an
expiry between requests counts) and checks the tool's scope, so a tool body only ever runs
for a principal allowed to run it.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from mcp.server.fastmcp import FastMCP
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations
from starlette.types import ASGIApp, Receive, Scope, Send

from schemas.errors import ErrorCode
from schemas.ids import is_action_id
from worker import tracing
from worker.errors import ConnectorError
from worker.gateway.children import now_ms
from worker.gateway.connector_host import PATHS as HOST_PATHS
from worker.gateway.connector_host import ConnectorHost
from worker.gateway.facade import DESCRIPTIONS, INPUT_SCHEMAS, META_KEY, invalid
from worker.gateway.http_limits import (
    InFlight,
    bounded_body,
    busy,
    lowercase_authority,
    send_response,
)
from worker.gateway.mcp_tools import FacadeTools, Outcome
from worker.gateway.observe import GatewayMetrics, ToolReceipts
from worker.gateway.principals import Principal, Principals, bearer
from worker.gateway.routes import RouteTable
from worker.gateway.service import GatewayService
from worker.gateway.settings import (
    ACTION_CANCEL,
    ACTION_READ,
    ACTION_WRITE,
    CAPABILITY_READ,
    GatewaySettings,
)

log = logging.getLogger(__name__)

MCP_PATH: Final = "/mcp"
#: The Host and Origin headers the SDK accepts from loopback clients (its own default for a
#: server on 127.0.0.1).
LOOPBACK_HOSTS: Final = ("127.0.0.1:*", "localhost:*", "[::1]:*")
LOOPBACK_ORIGINS: Final = ("http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*")
#: Tool -> the protected-resource scope it needs. Exactly these tools exist; `aip_delegate`
#: never does (first-class delegation belongs to the external orchestrator).
TOOL_SCOPES: Final = {
    "aip_capabilities": CAPABILITY_READ,
    "aip_call": ACTION_WRITE,
    "aip_action_status": ACTION_READ,
    "aip_action_result": ACTION_READ,
    "aip_action_events": ACTION_READ,
    "aip_action_cancel": ACTION_CANCEL,
}
Ready = Callable[[], Awaitable[dict[str, Any]]]


def _error_result(error: ConnectorError) -> CallToolResult:
    """A refusal as a tool error: `{"error": ProtocolError}` as text, and the error under
    `_meta["org.getaip/aip"]` as the reference carries an Action's error."""
    protocol = msgspec.to_builtins(error.to_protocol(endpoint_id=None, read_only=False))
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps({"error": protocol}))],
        isError=True,
        _meta={META_KEY: {"error": protocol}},
    )


def _capability_of(tool: str, arguments: object) -> object:
    """The capability a refused `aip_call` named, for its receipt (anything else: none)."""
    if tool != "aip_call" or not isinstance(arguments, dict):
        return None
    return arguments.get("capability_id")


def _transport_security(allowed_hosts: tuple[str, ...]) -> TransportSecuritySettings:
    """DNS-rebinding protection: the `Host` headers `/mcp` answers (others get 421).

    What the SDK enables by itself for a loopback server, plus `AIPD_MCP_ALLOWED_HOSTS`: a
    Hermes on another host calls the gateway by a name of its own (`gateway:8080` in
    compose), which the SDK's loopback-only default refuses. Browser origins stay loopback.
    """
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        # Lowercased like the request's headers (worker/gateway/http_limits.py): a host
        # name matches in any case.
        allowed_hosts=[host.lower() for host in (*LOOPBACK_HOSTS, *allowed_hosts)],
        allowed_origins=list(LOOPBACK_ORIGINS),
    )


def _new_fastmcp(allowed_hosts: tuple[str, ...]) -> FastMCP:
    # mcp 1.26's Settings model has a forward-referenced field that pydantic-settings warns
    # about on construction; harmless, and hosts running with `-W error` must still start.
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"Field 'lifespan' has an incomplete definition", category=UserWarning
        )
        # Stateless + JSON responses: every tool call is one self-contained POST, so there is
        # no session state to lose when a gateway dies, and any gateway can answer any call.
        return FastMCP(
            "aip",
            log_level="WARNING",
            stateless_http=True,
            json_response=True,
            transport_security=_transport_security(allowed_hosts),
        )


class GatewayHttp:
    """Builds the ASGI app around one `GatewayService`."""

    def __init__(
        self,
        settings: GatewaySettings,
        principals: Principals,
        routes: RouteTable,
        service: GatewayService,
        metrics: GatewayMetrics,
        receipts: ToolReceipts,
        ready: Ready,
        host: ConnectorHost | None = None,
    ) -> None:
        self.settings = settings
        #: The connector host over native HTTP, when configured: its two paths are signed
        #: Envelopes, authenticated by their signature, never by a bearer token.
        self.host = host
        self.principals = principals
        self.routes = routes
        self.service = service
        self.metrics = metrics
        self.receipts = receipts
        self.ready = ready
        self.tools = FacadeTools(service)
        self.mcp = _new_fastmcp(settings.allowed_hosts)
        self._register_tools()

    # --- tools ------------------------------------------------------------------------

    def _register_tools(self) -> None:
        """The six tools with the reference facade's input schemas (worker/gateway/facade.py),
        served by the SDK's low-level handlers: the schema a client lists is the one the
        arguments are checked against, and every argument reaches the check (a decorated
        Python signature would drop unknown fields and answer type errors in its own words)."""
        server = self.mcp._mcp_server
        tools = [
            Tool(
                name=name,
                title=name.replace("_", "."),
                description=DESCRIPTIONS[name],
                inputSchema=INPUT_SCHEMAS[name],
                annotations=ToolAnnotations(
                    readOnlyHint=name not in ("aip_call", "aip_action_cancel"),
                    openWorldHint=False,
                ),
            )
            for name in TOOL_SCOPES
        ]

        async def list_tools() -> list[Tool]:
            return tools

        async def call_tool(name: str, arguments: dict[str, Any]) -> CallToolResult:
            return await self._run(name, server.request_context.request, arguments)

        server.list_tools()(list_tools)  # type: ignore[no-untyped-call]
        server.call_tool(validate_input=False)(call_tool)

    def _principal_of(self, request: Any) -> Principal | None:
        token = bearer(request.scope) if request is not None else None
        return self.principals.authenticate(token, now_ms=now_ms())

    async def _run(self, tool: str, request: Any, arguments: dict[str, Any]) -> CallToolResult:
        with tracing.span(
            f"execute_tool {tool}",
            kind="server",
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool},
            # The caller's trace (a Hermes run that propagates W3C trace context).
            carrier=tracing.trace_context(request.headers) if request is not None else {},
        ):
            return await self._tool(tool, request, arguments)

    async def _tool(self, tool: str, request: Any, arguments: dict[str, Any]) -> CallToolResult:
        if tool not in TOOL_SCOPES:
            error = invalid(f"no tool {tool[:100]!r} here (tools: {', '.join(TOOL_SCOPES)})")
            return _error_result(error)
        principal = self._principal_of(request)
        if principal is None:  # expired since the 401 gate, or no token reached the tool
            error = ConnectorError(ErrorCode.HOST_AUTHENTICATION, "the bearer token is not valid")
            return _error_result(error)
        scope = TOOL_SCOPES[tool]
        outcome: Outcome | None = None
        refusal: ConnectorError | None = None
        if scope not in self.settings.supported_scopes:
            refusal = ConnectorError(
                ErrorCode.HOST_AUTHENTICATION, f"scope {scope} is not supported by this server"
            )
        elif not principal.has(scope):
            refusal = ConnectorError(
                ErrorCode.HOST_AUTHENTICATION, f"the token lacks scope {scope} for {tool}"
            )
        else:
            try:
                outcome = await self.tools.run(tool, principal, arguments)
            except ConnectorError as exc:
                refusal = exc
            except Exception as exc:
                log.exception("tool %s failed", tool)
                refusal = ConnectorError(
                    ErrorCode.HOST_EXECUTION, f"the gateway failed ({type(exc).__name__})"
                )
        decision = "allowed" if refusal is None else refusal.code.value
        self.metrics.tool_call(tool, "allowed" if refusal is None else "refused")
        # No action_id for the receipt of a refused call: a supplied id is not the child's
        # (it is namespaced), and a refusal must not append to the chain of whatever Action
        # that id names.
        await self._receipt(
            tool,
            principal,
            decision,
            outcome.bus_action_id if outcome is not None else None,
            outcome.capability if outcome is not None else _capability_of(tool, arguments),
        )
        if refusal is not None or outcome is None:
            return _error_result(refusal or invalid("no answer"))
        return CallToolResult(
            content=[TextContent(type="text", text=outcome.text)],
            structuredContent=outcome.structured,
            isError=outcome.is_error,
            _meta=outcome.meta,
        )

    async def _receipt(
        self,
        tool: str,
        principal: Principal,
        decision: str,
        action_id: str | None,
        capability: object,
    ) -> None:
        child = action_id if isinstance(action_id, str) and is_action_id(action_id) else None
        route = self.routes.resolve(capability) if isinstance(capability, str) else None
        await self.receipts.emit(
            tool=tool,
            principal_id=principal.principal_id,
            tenant_id=principal.tenant_id,
            decision=decision,
            action_id=child,
            endpoint_id=route.audit_endpoint if route is not None and child else None,
            capability=capability[:512] if isinstance(capability, str) else None,
            child_action_id=child,
        )

    # --- HTTP -------------------------------------------------------------------------

    def app(self) -> ASGIApp:
        inner = self.mcp.streamable_http_app()  # its lifespan runs the MCP session manager
        transport_scopes = self.settings.transport_scopes
        inflight = InFlight(self.settings.gateway_max_requests)

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                path = scope.get("path", "")
                if path in ("/health", "/ready", "/metrics"):
                    await self._plain(path, send)
                    return
                if self.host is not None and path in HOST_PATHS:
                    await self.host.serve(scope, receive, send)
                    return
                principal = self.principals.authenticate(bearer(scope), now_ms=now_ms())
                if principal is None:
                    self.metrics.unauthenticated.inc()
                    await _refuse(send, 401, "invalid_token", "unknown, expired or missing token")
                    return
                if any(not principal.has(s) for s in transport_scopes):
                    await _refuse(send, 403, "insufficient_scope", "the token lacks MCP scopes")
                    return
                if not inflight.enter():
                    await busy(send, inflight.limit)
                    return
                try:
                    # The body is bounded before the SDK reads any of it (http_limits.py).
                    await bounded_body(
                        inner,
                        lowercase_authority(scope),
                        receive,
                        send,
                        self.settings.gateway_max_body_bytes,
                    )
                finally:
                    inflight.leave()
                return
            await inner(scope, receive, send)

        return app

    async def _plain(self, path: str, send: Send) -> None:
        if path == "/metrics":
            body, content_type = self.metrics.render()
            await _respond(send, 200, body, content_type)
            return
        if path == "/health":
            await _respond(send, 200, b'{"alive": true}', "application/json")
            return
        document = await self.ready()
        self.metrics.ready.set(1 if document["ready"] else 0)
        await _respond(
            send,
            200 if document["ready"] else 503,
            json.dumps(document).encode(),
            "application/json",
        )


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send_response(send, status, body, content_type.encode())


async def _refuse(send: Send, status: int, error: str, description: str) -> None:
    body = json.dumps({"error": error, "error_description": description}).encode()
    authenticate = (b"www-authenticate", f'Bearer error="{error}"'.encode())
    await send_response(send, status, body, extra_headers=(authenticate,))
