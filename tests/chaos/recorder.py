"""A recording HTTP proxy in front of the real Hermes: its request log, for the checker.

The checker judges Hermes' side by the requests that reached it (`start_once`: at most one
`POST /v1/runs` per operator Action, `approval_once`, `signed_only`, `honest`). The fake
Hermes logs them itself; the real `hermes-agent` 0.19.0 is another program whose memory the
campaign cannot read. So the real-Hermes deployment puts a `HermesRecorder` between the
workers' fault proxies and Hermes: every request that reaches it is logged as a
`RecordedRequest`, the row the fake's own log holds (method, path, route template, headers,
parsed JSON body, run id, wall time), then forwarded. Route templates come from the fake's
own route table (`worker.testing.fake_hermes.app.ROUTES`), so a row of either log names a
route the same way and the checker reads both unchanged.

What counts as "reached Hermes" is conservative in one direction only: a request is logged
once its whole body arrived here, and dropped from the log again only when Hermes refused
the connection (down, or restarting), which proves it never got there. Then the worker's
connection is reset without an answer, as a direct connection mid-request would be, so the
worker cannot read the refusal as "certainly not sent". A request Hermes accepted and then
dropped (a restart mid-request) stays logged: it may have taken effect.

Responses stream through as they arrive (SSE run events and chat deltas are written chunk
by chunk, never buffered), bytes unchanged (no decompression), status and headers copied
except the hop-by-hop ones. `delays` holds a request for that long after logging it and
before forwarding it, per route (the fake's `RouteDelay`): a slow Hermes, so that faults
land while requests are in flight.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from worker.testing.fake_hermes.app import ROUTES
from worker.testing.fake_hermes.middleware import MAX_REQUEST_BYTES, PROFILE_PREFIX
from worker.testing.fake_hermes.stats import RecordedRequest, now

HOST = "127.0.0.1"
#: Headers that describe one hop, not the message (RFC 9110 7.6.1), plus the ones the
#: client library sets itself for the next hop. `Content-Length` of a response is kept.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
#: Never kept in the log: the campaign's history may be written to disk.
SECRET_HEADERS = frozenset({"authorization"})
#: The catch-all route's name: a path Hermes has no route for is logged as `METHOD /path`.
_UNKNOWN = "unknown"


def parse_json(raw: bytes) -> Any:
    """The body as JSON, or None when it is empty or not JSON (as the fake logs it)."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


@dataclass
class HermesRecorder:
    """`127.0.0.1:port` forwarding HTTP to Hermes on `upstream_port`, logging each request."""

    upstream_port: int
    port: int = 0
    #: Route template -> seconds each such request is held before it is forwarded.
    delays: dict[str, float] = field(default_factory=dict)
    _log: list[RecordedRequest] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None
    #: Requests refused by Hermes (connection refused), hence dropped from the log.
    refused: int = 0

    async def start(self) -> HermesRecorder:
        # No pool limit, no timeout: an SSE stream of a run waiting for approval is idle
        # for minutes, and a request held by a partition must not be failed here.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=MAX_REQUEST_BYTES + 1)
        for method, path, _handler in ROUTES:
            app.router.add_route(method, path, self._forward)
            app.router.add_route(method, PROFILE_PREFIX + path, self._forward)
        app.router.add_route("*", "/{tail:.*}", self._forward, name=_UNKNOWN)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, HOST, self.port).start()
        self.port = self._runner.addresses[0][1]
        return self

    def requests(self) -> list[RecordedRequest]:
        """Every request that reached Hermes, oldest first (as `FakeHermes.requests`)."""
        return list(self._log)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        raw = await request.read() if request.can_read_body else b""
        route = route_template(request)
        row = RecordedRequest(
            method=request.method,
            path=request.path,
            route=route,
            headers={k: v for k, v in request.headers.items() if k.lower() not in SECRET_HEADERS},
            body=parse_json(raw),
            run_id=request.match_info.get("run_id"),
            at=now(),
        )
        self._log.append(row)
        delay = self.delays.get(route)
        if delay:
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                # The worker's connection ended while the request was held here: it never
                # went on to Hermes.
                self._log.remove(row)
                raise
        # The body goes on as read (the client library sets its length for the next hop).
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"
        }
        url = URL(f"http://{HOST}:{self.upstream_port}{request.raw_path}", encoded=True)
        try:
            upstream = await self._session.request(
                request.method, url, headers=headers, data=raw or None, allow_redirects=False
            )
        except aiohttp.ClientConnectorError:
            # Hermes is down: the request never reached it. The worker's connection is
            # reset with no answer, as its own direct connection would have been mid-way.
            self._log.remove(row)
            self.refused += 1
            return _reset(request)
        except aiohttp.ClientError:
            # Connected, then dropped (a restart mid-request): it may have taken effect.
            return _reset(request)
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value)
            try:
                await response.prepare(request)
                async for data in upstream.content.iter_any():
                    await response.write(data)
                await response.write_eof()
            except (aiohttp.ClientError, ConnectionError):
                # Hermes dropped the stream, or the worker went away (a fault proxy's drop):
                # each side sees its connection end, as it would have without the recorder.
                if request.transport is not None:
                    request.transport.abort()
            return response


def route_template(request: web.Request) -> str:
    """`"METHOD /path/{param}"` as the fake names it (profile prefix removed); for a path
    Hermes has no route for, `"METHOD /path"`."""
    resource = request.match_info.route.resource
    if resource is None or resource.name == _UNKNOWN:
        return f"{request.method} {request.path}"
    return f"{request.method} {resource.canonical.removeprefix(PROFILE_PREFIX)}"


def _reset(request: web.Request) -> web.StreamResponse:
    """End the worker's connection with no answer (the 502 is never written)."""
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=502)
