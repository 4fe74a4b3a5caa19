"""The unauthenticated `/_fake/…` control routes (test-only; see the package docstring)."""

from __future__ import annotations

import msgspec
from aiohttp import web

from worker.testing.fake_hermes.envelopes import json_reply
from worker.testing.fake_hermes.faults import decode_faults, encode_faults
from worker.testing.fake_hermes.state import STATE


async def get_stats(request: web.Request) -> web.Response:
    """GET /_fake/stats → counts per route template, per run id, starts per session."""
    return json_reply(request.app[STATE].stats.snapshot().to_json())


async def get_requests(request: web.Request) -> web.Response:
    """GET /_fake/requests[?route=POST%20/v1/runs] → recent requests, oldest first."""
    route = request.query.get("route")
    rows = [
        r.to_json()
        for r in request.app[STATE].stats.requests()
        if route is None or r.route == route
    ]
    return json_reply({"requests": rows})


async def get_faults(request: web.Request) -> web.Response:
    """GET /_fake/faults → the armed faults with their remaining `times`."""
    body = encode_faults(request.app[STATE].faults.armed())
    return web.Response(body=body, content_type="application/json")


async def add_faults(request: web.Request) -> web.Response:
    """POST /_fake/faults with one fault object or a list → armed in order."""
    try:
        new = decode_faults(await request.read())
        request.app[STATE].faults.add(*new)
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
        return json_reply({"error": str(exc)}, status=400)
    return json_reply({"armed": len(new)})


async def clear_faults(request: web.Request) -> web.Response:
    """DELETE /_fake/faults → disarm everything."""
    request.app[STATE].faults.clear()
    return json_reply({"ok": True})


async def restart(request: web.Request) -> web.Response:
    """POST /_fake/restart → forget runs, cut streams, drop the idempotency cache."""
    request.app[STATE].restart()
    return json_reply({"ok": True})


async def reset(request: web.Request) -> web.Response:
    """POST /_fake/reset → clear stats, the request log and every fault."""
    state = request.app[STATE]
    state.stats.clear()
    state.faults.clear()
    return json_reply({"ok": True})


def add_control_routes(app: web.Application) -> None:
    """Register `/_fake/…`."""
    app.router.add_get("/_fake/stats", get_stats)
    app.router.add_get("/_fake/requests", get_requests)
    app.router.add_get("/_fake/faults", get_faults)
    app.router.add_post("/_fake/faults", add_faults)
    app.router.add_delete("/_fake/faults", clear_faults)
    app.router.add_post("/_fake/restart", restart)
    app.router.add_post("/_fake/reset", reset)
