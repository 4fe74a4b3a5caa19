"""A deliberately broken Hermes endpoint the driver serves itself (item 10, and item 6's
unconfirmed cancel).

A live Hermes cannot be told to answer garbage, to go away, or to never confirm a stop, so
the driver stands in for one: the deployment configures an endpoint (e.g. `broken`) whose
URL is this server, and the driver switches what it does between checks:

- `MALFORMED`: every route answers 200 with a body that is not JSON;
- `NEVER_STOPS`: a run starts (`202` with a run id), says `running` forever, has no event
  stream, and answers a stop with `stopping` that never becomes `cancelled`;
- stopped (`close()`): nothing listens: a provider outage.

It needs no key check: it holds nothing, and every answer is an error case.
"""

from __future__ import annotations

import enum
import secrets
from typing import Any

from aiohttp import web

#: What a malformed answer looks like: JSON cut off mid-document.
TRUNCATED = '{"object": "list", "data": ['


class Mode(enum.Enum):
    MALFORMED = "malformed"
    NEVER_STOPS = "never_stops"


class BrokenHermes:
    """`await start(host, port)`, set `mode`, `await close()` for the outage."""

    def __init__(self) -> None:
        self.mode = Mode.MALFORMED
        self._runner: web.AppRunner | None = None
        #: Runs started while `NEVER_STOPS`, with how often a stop was asked.
        self.stops: dict[str, int] = {}

    async def start(self, host: str, port: int) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def listening(self) -> bool:
        return self._runner is not None

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if self.mode is Mode.MALFORMED:
            return web.Response(
                status=200, text='{"object": "list", "data": [', content_type="application/json"
            )
        return self._never_stops(request)

    def _never_stops(self, request: web.Request) -> web.Response:
        path = request.path.rstrip("/")
        if request.method == "POST" and path == "/v1/runs":
            run_id = "run_" + secrets.token_hex(16)
            self.stops[run_id] = 0
            return web.json_response({"run_id": run_id, "status": "started"}, status=202)
        parts = path.split("/")
        if len(parts) >= 4 and parts[1:3] == ["v1", "runs"] and parts[3] in self.stops:
            run_id = parts[3]
            if len(parts) == 4 and request.method == "GET":
                return web.json_response(_status(run_id, "running"))
            if parts[4:] == ["stop"] and request.method == "POST":
                self.stops[run_id] += 1
                return web.json_response({"run_id": run_id, "status": "stopping"})
        return web.json_response(
            {"error": {"message": "not found", "type": "invalid_request_error", "code": None}},
            status=404,
        )


def _status(run_id: str, status: str) -> dict[str, Any]:
    return {
        "object": "hermes.run",
        "run_id": run_id,
        "status": status,
        "session_id": run_id,
        "last_event": None,
    }
