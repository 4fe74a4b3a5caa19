"""What an HTTP request to `/mcp` may be before the MCP SDK sees it: its body is bounded, its
`Host` / `Origin` compared as the names they are (case-insensitively), and how many run at
once is capped.

Why here and not in the SDK: FastMCP's Streamable HTTP transport reads the whole body into
memory before it parses a byte of it, so five concurrent 200 MB `aip_call`s held 3.1 GB in
the gateway (issue 27). `bounded_body` answers a declared `Content-Length` over
`AIPD_GATEWAY_MAX_BODY_BYTES` with 413 without reading it, and reads an undeclared
(chunked) body itself, at most that many bytes, before it hands the buffered body on: no
request ever costs more than the bound, whatever the client sends.

Host names are case-insensitive (RFC 9110 §4.2.3), but the SDK's DNS-rebinding check
compares the header byte for byte, so `Gateway:8080` was refused where `gateway:8080` is
allowed. `lowercase_authority` lowercases both headers before the check, and the allowed
lists are lowercased where they are built (mcp_app.py).

Concurrency has two walls, both answered with a clean 503, never a reset (291 of 3,000
concurrent connections were reset before): `InFlight` caps the `/mcp` requests being
served at `AIPD_GATEWAY_MAX_REQUESTS` (the next one gets 503 with a typed body and
`Retry-After`, while those in flight go on), and uvicorn's `limit_concurrency`
(`AIPD_GATEWAY_MAX_CONNECTIONS`) caps open connections: while more are open, every new
request gets uvicorn's 503. The listen backlog (`AIPD_GATEWAY_BACKLOG`) is what the kernel
queues before accept (docs/scaling.md, "Gateway").
"""

from __future__ import annotations

import json
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas.errors import ErrorCode

#: The headers whose values are host names (compared case-insensitively).
_AUTHORITY_HEADERS: Final = (b"host", b"origin")


def lowercase_authority(scope: Scope) -> Scope:
    """`scope` with its `Host` and `Origin` header values lowercased."""
    headers = [
        (name, value.lower() if name.lower() in _AUTHORITY_HEADERS else value)
        for name, value in scope.get("headers") or ()
    ]
    return {**scope, "headers": headers}


def declared_length(scope: Scope) -> int | None:
    """The request's `Content-Length`, or None when it declares none (or a malformed one,
    which uvicorn refuses before the app runs anyway)."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def send_response(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    extra_headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """One complete ASGI response: every answer the gateway writes itself goes out here."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send(
        {"type": "http.response.start", "status": status, "headers": [*headers, *extra_headers]}
    )
    await send({"type": "http.response.body", "body": body})


async def too_large(send: Send, max_bytes: int) -> None:
    """413 with a typed body: the project's error code and the bound."""
    body = json.dumps(
        {
            "error": "request_too_large",
            "code": ErrorCode.SCHEMA_ENVELOPE_INVALID.value,
            "error_description": f"the request body is over {max_bytes} bytes "
            "(AIPD_GATEWAY_MAX_BODY_BYTES)",
            "max_bytes": max_bytes,
        }
    ).encode()
    await send_response(send, 413, body, extra_headers=((b"connection", b"close"),))


async def bounded_body(
    inner: ASGIApp, scope: Scope, receive: Receive, send: Send, max_bytes: int
) -> None:
    """Run `inner` on the request only if its body is at most `max_bytes` (else 413).

    A declared length is judged before anything is read. Otherwise (or when the declared
    length is within the bound, in case the client sends more than it declared) the body
    is read here, chunk by chunk, and refused the moment it passes the bound; `inner` then
    receives the whole body in one message, and later `receive` calls (a disconnect) go
    to the connection as before.
    """
    declared = declared_length(scope)
    if declared is not None and declared > max_bytes:
        await too_large(send, max_bytes)
        return
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: nothing to serve
            return
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            await too_large(send, max_bytes)
            return
        parts.append(chunk)
        if not message.get("more_body", False):
            break
    body = b"".join(parts)
    buffered: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        if buffered:
            return buffered.pop()
        return await receive()

    await inner(scope, replay, send)


class InFlight:
    """Counts the `/mcp` requests being served; `enter` refuses past `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def enter(self) -> bool:
        if self.count >= self.limit:
            return False
        self.count += 1
        return True

    def leave(self) -> None:
        self.count -= 1


async def busy(send: Send, limit: int) -> None:
    """503 with a typed body (`connector_host.capacity`, retryable) and `Retry-After`."""
    body = json.dumps(
        {
            "error": "temporarily_unavailable",
            "code": ErrorCode.HOST_CAPACITY.value,
            "error_description": f"the gateway is serving {limit} requests "
            "(AIPD_GATEWAY_MAX_REQUESTS); retry shortly",
        }
    ).encode()
    await send_response(send, 503, body, extra_headers=((b"retry-after", b"1"),))
