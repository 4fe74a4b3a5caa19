"""The exact response bodies and headers Hermes 0.19.0 sends, in one place.

Hermes uses three error shapes (OpenAI standard, a short form without `param`/`code`, and the
jobs API's flat string) plus a 401 body without `param`. Clients are tested against these
byte shapes, so every handler builds its replies here instead of inventing its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

#: Headers the real middleware adds to every non-streaming JSON reply (never to SSE).
SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
    "Strict-Transport-Security": "max-age=31536000; includeSubDomains",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "X-XSS-Protection": "0",
    "Referrer-Policy": "no-referrer",
}


def dumps(obj: object) -> str:
    """Serialize like Python's `json.dumps` with its defaults (`", "` separators, ASCII)."""
    return json.dumps(obj)


def json_reply(
    body: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A JSON reply; security headers are added later by the middleware."""
    return web.json_response(body, status=status, headers=headers, dumps=dumps)


def openai_error(
    message: str,
    *,
    status: int = 400,
    code: str | None = None,
    param: str | None = None,
    err_type: str = "invalid_request_error",
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """The standard envelope `{"error":{"message","type","param","code"}}`."""
    error = {"message": message, "type": err_type, "param": param, "code": code}
    return json_reply({"error": error}, status=status, headers=headers)


def short_error(message: str, *, status: int = 400) -> web.Response:
    """The short envelope, no `param` and no `code` (session header checks, chat messages)."""
    return json_reply(
        {"error": {"message": message, "type": "invalid_request_error"}}, status=status
    )


def jobs_error(message: str, *, status: int) -> web.Response:
    """The jobs API's flat `{"error": "<string>"}`."""
    return json_reply({"error": message}, status=status)


def unauthorized() -> web.Response:
    """The 401 body: note that it carries no `param` key."""
    error = {
        "message": "Invalid API key",
        "type": "invalid_request_error",
        "code": "invalid_api_key",
    }
    return json_reply({"error": error}, status=401)


def run_not_found(run_id: str) -> web.Response:
    """404 for an unknown, forgotten, finished-then-stopped or consumed run."""
    return openai_error(f"Run not found: {run_id}", status=404, code="run_not_found")


def not_active(run_id: str) -> web.Response:
    """409 for a stop or approval on a finished run (after 0.19 only)."""
    return openai_error(f"Run is not active: {run_id}", status=409, code="run_not_active")


def session_not_found(session_id: str) -> web.Response:
    """404 for a session id the store does not hold."""
    return openai_error(f"Session not found: {session_id}", status=404, code="session_not_found")


def rate_limited(max_runs: int) -> web.Response:
    """429 for the shared concurrent-run cap, with `Retry-After: 1` as observed."""
    return openai_error(
        f"Too many concurrent runs (max {max_runs})",
        status=429,
        code="rate_limit_exceeded",
        err_type="rate_limit_error",
        headers={"Retry-After": "1"},
    )


def draining() -> web.Response:
    """503 while the gateway shuts down (from Hermes' code), with `Retry-After: 1`."""
    return openai_error(
        "Gateway is draining existing work; retry shortly.",
        status=503,
        code="gateway_draining",
        headers={"Retry-After": "1"},
    )


def server_error(message: str = "Internal server error", *, status: int = 500) -> web.Response:
    """A JSON 5xx in the standard envelope with `type: server_error`."""
    return openai_error(message, status=status, err_type="server_error")


def aiohttp_500() -> web.Response:
    """aiohttp's own page for an unhandled exception: text, `Connection: close`."""
    return web.Response(
        status=500,
        text="500 Internal Server Error\n\nServer got itself in trouble",
        headers={"Connection": "close"},
    )


async def read_json(request: web.Request) -> tuple[bool, Any]:
    """Parse the body as JSON; `(False, None)` when it is empty or not JSON."""
    raw = await request.read()
    if not raw:
        return False, None
    try:
        return True, json.loads(raw)
    except ValueError:
        return False, None
