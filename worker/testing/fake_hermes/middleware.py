"""What happens to every request before and after its handler, in Hermes' order.

Origin check (403, empty, before auth) → body size (413) → recording for `/_fake/stats` →
route faults → bearer auth (all but `/health`) → handler → security headers on JSON replies.
aiohttp's own 404/405 pass through untouched (text/plain, no auth, no security headers), and
the `/_fake/` control routes bypass everything.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from worker.testing.fake_hermes import faults as f
from worker.testing.fake_hermes.envelopes import (
    SECURITY_HEADERS,
    draining,
    openai_error,
    server_error,
    unauthorized,
)
from worker.testing.fake_hermes.state import STATE, FakeState
from worker.testing.fake_hermes.stats import RecordedRequest, is_probe, now

CONTROL_PREFIX = "/_fake/"
PROFILE_PREFIX = "/p/{profile}"
MAX_REQUEST_BYTES = 10_000_000
UNAUTHENTICATED = frozenset({"/health", "/v1/health"})


def route_template(request: web.Request) -> str | None:
    """`"METHOD /path/{param}"` for a matched route (profile prefix removed), else None."""
    if request.match_info.http_exception is not None:
        return None
    resource = request.match_info.route.resource
    if resource is None:
        return None
    return f"{request.method} {resource.canonical.removeprefix(PROFILE_PREFIX)}"


def _secure(response: web.StreamResponse) -> web.StreamResponse:
    if (
        isinstance(response, web.Response)
        and not response.prepared
        and response.content_type == "application/json"
    ):
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
    return response


def _authorized(request: web.Request, api_key: str) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), api_key.encode())


async def _record(
    state: FakeState, request: web.Request, route: str | None
) -> tuple[Any, str, str | None]:
    raw = await request.read() if request.can_read_body else b""
    body: Any = None
    if raw:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
    run_id = request.match_info.get("run_id")
    state.stats.record(
        RecordedRequest(
            method=request.method,
            path=request.path,
            route=route or f"{request.method} {request.path}",
            headers=dict(request.headers),
            body=body,
            run_id=run_id,
            at=now(),
        )
    )
    text = raw.decode("utf-8", "replace")
    if run_id is not None and (run := state.runs.get(run_id)) is not None:
        text += "\n" + run.input_text
    return body, text, run_id


@web.middleware
async def hermes_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The request pipeline of the fake (see the module docstring for the order)."""
    if request.path.startswith(CONTROL_PREFIX):
        return await handler(request)
    if "Origin" in request.headers:
        return web.Response(status=403)
    length = request.content_length
    if length is not None and length > MAX_REQUEST_BYTES:
        return _secure(openai_error("Request body too large.", status=413, code="body_too_large"))
    state = request.app[STATE]
    route = route_template(request)
    _, text, run_id = await _record(state, request, route)
    if route is not None:
        fault = state.faults.take_route(route, run_id, text, probe=is_probe(request.headers))
        match fault:
            case f.RouteRedirect(status=status, location=location):
                return web.Response(status=status, headers={"Location": location})
            case f.RouteError(status=status):
                return _secure(server_error(status=status))
            case f.RouteDraining():
                return _secure(draining())
            case f.RouteDelay(delay_s=delay_s):
                await asyncio.sleep(delay_s)
        path = route.split(" ", 1)[1]
        if path not in UNAUTHENTICATED and not _authorized(request, state.config.api_key):
            return _secure(unauthorized())
    return _secure(await handler(request))
