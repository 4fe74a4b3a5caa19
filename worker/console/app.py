"""The console process: authenticate every request, render pages, follow a run's chunks.

`Authenticated` (an ASGI wrapper around every route) is the one place a request is let in:
`/health`, `/login`, `/logout` and the page script answer anyone; everything else needs a
token of the tokens file, as `Authorization: Bearer <token>` or the cookie `/login` sets
(HttpOnly, SameSite=Strict, Path=/, Secure over https), and gets 401 with the login form
otherwise. Which records a token sees is decided in `worker/console/reads.py`.

Every answer carries a Content-Security-Policy that lets only the console's own script run
and only its own origin be fetched, and `Cache-Control: no-store` (a page names principals).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs

import nats
import nats.errors
from nats.aio.client import Client as NATS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from subjects.grammar import Subjects
from worker.bus.connections import connect_nats as connect
from worker.bus.connections import open_redis_for
from worker.commands.bus_commands import chunk_text, retraction_text
from worker.commands.cli_settings import believed_worker_keys
from worker.console import pages
from worker.console.reads import ConsoleReader, RunFilter
from worker.console.settings import ConsoleSettings
from worker.console.tokens import ConsoleTokens, Viewer
from worker.errors import UnverifiedResponse
from worker.gateway.principals import bearer
from worker.http_serving import Served
from worker.settings import Settings
from worker.store.clock import now_ms
from worker.tasks import stop_tasks
from worker.trust.responses import ChunkRetraction

log = logging.getLogger(__name__)

#: What a test waits for in the console's log before it calls it.
READY_MARK = "console serving"
COOKIE = "aipd_console_token"
#: Paths that answer without a token.
OPEN_PATHS = frozenset({"/health", "/login", "/logout", "/console.js"})
#: Bound on a login form's body (a token and its field name).
MAX_LOGIN_BYTES = 4_096
PORT_SETTINGS = "AIPD_CONSOLE_PORT (and AIPD_CONSOLE_HOST)"
_SHUTDOWN_TIMEOUT_S = 5.0
#: How long a followed run may stay silent before the page says so (it can reload).
FOLLOW_IDLE_S = 3600.0
#: Silence on a followed run after which an SSE comment is sent.
KEEPALIVE_S = 15.0

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

#: The run page's one script: follow the chunk stream (server-sent events) until the run's
#: result is out (`end`), then reload once to show the result. Chunks, and a retraction of chunks
#: shown that were not the run's, are written as text only.
FOLLOW_JS = """(function () {
  var box = document.getElementById('chunks');
  if (!box) { return; }
  var state = document.getElementById('stream-state');
  var source = new EventSource(box.dataset.src);
  source.addEventListener('chunk', function (e) { box.textContent += e.data + '\\n'; });
  source.addEventListener('end', function () {
    source.close(); state.textContent = 'ended';
    if (box.dataset.settled !== 'yes') { location.reload(); }
  });
  source.addEventListener('retracted', function (e) { box.textContent += e.data + '\\n'; });
  source.addEventListener('refused', function (e) { source.close(); state.textContent = e.data; });
})();
"""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _token_of(scope: Scope) -> str | None:
    """The bearer token of a request: its Authorization header, else the login cookie."""
    token = bearer(scope)
    if token is not None:
        return token
    cookie_header = ""
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    for name, value in headers:
        if name == b"cookie":
            cookie_header = value.decode("latin-1")
    if cookie_header:
        cookies: SimpleCookie = SimpleCookie()
        with contextlib.suppress(Exception):
            cookies.load(cookie_header)
        morsel = cookies.get(COOKIE)
        if morsel is not None and morsel.value:
            return str(morsel.value)
    return None


class Authenticated:
    """ASGI wrapper: only `OPEN_PATHS` answer without a known, unexpired token; the
    authenticated `Viewer` is put in the request's state for the routes."""

    def __init__(
        self, app: Callable[[Scope, Receive, Send], Awaitable[None]], tokens: ConsoleTokens
    ) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        viewer = self.tokens.authenticate(_token_of(scope), now_ms=now_ms())
        if viewer is None:
            response = HTMLResponse(
                pages.login("A console token is needed."),
                status_code=401,
                headers={**_HEADERS, "WWW-Authenticate": 'Bearer realm="aip-console"'},
            )
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["viewer"] = viewer
        await self.app(scope, receive, send)


def _html(text: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status_code, headers=_HEADERS)


def _viewer(request: Request) -> Viewer:
    viewer: Viewer = request.state.viewer
    return viewer


def _utc_ms(text: str) -> int | None:
    """An ISO date-time (UTC when it names no zone) as Unix ms; None when empty."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an ISO date-time: {text[:40]!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


class ConsoleHttp:
    """The routes, over one `ConsoleReader`."""

    def __init__(self, reader: ConsoleReader, tokens: ConsoleTokens) -> None:
        self.reader = reader
        self.tokens = tokens

    def app(self) -> Any:
        routes = [
            Route("/health", self.health),
            Route("/console.js", self.script),
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/", self.home),
            Route("/runs", self.runs),
            Route("/runs/{endpoint}/{action_id}", self.run),
            Route("/runs/{endpoint}/{action_id}/chunks", self.chunks),
            Route("/escalations", self.escalations),
            Route("/dlq", self.dlq),
            Route("/workers", self.workers),
        ]
        return Authenticated(Starlette(routes=routes), self.tokens)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"}, headers=_HEADERS)

    async def script(self, request: Request) -> Response:
        return Response(FOLLOW_JS, media_type="text/javascript", headers=_HEADERS)

    async def login_form(self, request: Request) -> Response:
        return _html(pages.login())

    async def login(self, request: Request) -> Response:
        body = b""
        async for part in request.stream():
            body += part
            if len(body) > MAX_LOGIN_BYTES:
                return _html(pages.login("That is not a console token."), 413)
        token = parse_qs(body.decode("utf-8", "replace")).get("token", [""])[0].strip()
        viewer = self.tokens.authenticate(token, now_ms=now_ms())
        if viewer is None:
            return _html(pages.login("That token is not known, or has expired."), 401)
        response = RedirectResponse("/runs", status_code=303, headers=_HEADERS)
        response.set_cookie(
            COOKIE,
            token,
            max_age=max(0, (viewer.expires_at_unix_ms - now_ms()) // 1000),
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(self, request: Request) -> Response:
        response = RedirectResponse("/login", status_code=303, headers=_HEADERS)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/runs", status_code=303, headers=_HEADERS)

    async def runs(self, request: Request) -> Response:
        q = request.query_params
        since, until = q.get("since", ""), q.get("until", "")
        try:
            wanted = RunFilter(
                endpoint_id=q.get("endpoint") or None,
                state=q.get("state") or None,
                principal_id=q.get("principal") or None,
                since_ms=_utc_ms(since),
                until_ms=_utc_ms(until),
            )
        except ValueError as exc:
            return _html(pages.page("Runs", _viewer(request), pages.esc(exc)), 400)
        found = await self.reader.runs(_viewer(request), wanted)
        return _html(pages.runs(_viewer(request), found, wanted, since, until))

    async def run(self, request: Request) -> Response:
        p = request.path_params
        detail = await self.reader.run(_viewer(request), p["endpoint"], p["action_id"])
        if detail is None:
            return _html(pages.page("Not found", _viewer(request), "No such run."), 404)
        return _html(pages.run(_viewer(request), detail))

    async def chunks(self, request: Request) -> Response:
        """The run's chunks as server-sent events: `chunk` for each (a run of a
        non-streaming capability has none, as in AIP), then `end` once its ActionResult is
        out, the result's status as its data: the result, not a terminal chunk, says a run
        ended. `retracted` when chunks shown turn out not to be the run's, its own
        following; `refused` when the stream or the result does not verify or stays
        silent."""
        p = request.path_params
        detail = await self.reader.run(_viewer(request), p["endpoint"], p["action_id"])
        if detail is None:
            return _html(pages.page("Not found", _viewer(request), "No such run."), 404)
        handle = self.reader.client.handle(p["endpoint"], p["action_id"])

        async def events() -> AsyncIterator[str]:
            try:
                # The iterator ends after the terminal chunk, or on the result of a run
                # without a chunk stream (`ActionHandle.chunk_envelopes`).
                async for chunk in handle.chunks(idle_timeout_s=FOLLOW_IDLE_S):
                    if isinstance(chunk, ChunkRetraction):
                        yield f"event: retracted\ndata: {retraction_text(chunk)}\n\n"
                        continue
                    line = chunk_text(chunk).replace("\r", " ").replace("\n", " ")
                    yield f"event: chunk\ndata: {line}\n\n"
                # A terminal chunk goes out before the result: the run has ended when its
                # result is out, so the page reloaded on `end` shows it.
                result = await handle.result(timeout_s=FOLLOW_IDLE_S)
                yield f"event: end\ndata: {result.status.value}\n\n"
            except UnverifiedResponse as exc:
                yield f"event: refused\ndata: not verified: {str(exc)[:200]}\n\n"
            except nats.errors.TimeoutError:
                yield "event: refused\ndata: silent for an hour: reload to follow again\n\n"

        return StreamingResponse(
            with_keepalive(events(), KEEPALIVE_S),
            media_type="text/event-stream",
            headers={**_HEADERS, "X-Accel-Buffering": "no"},
        )

    async def escalations(self, request: Request) -> Response:
        found = await self.reader.escalations(_viewer(request))
        return _html(pages.escalations(_viewer(request), found, now_ms()))

    async def dlq(self, request: Request) -> Response:
        found = await self.reader.dead_letters(_viewer(request))
        return _html(pages.dead_letters(_viewer(request), found))

    async def workers(self, request: Request) -> Response:
        found = await self.reader.workers(_viewer(request))
        return _html(pages.workers(_viewer(request), found))


async def with_keepalive(events: AsyncIterator[str], every_s: float) -> AsyncIterator[str]:
    """`events`, with an SSE comment after each `every_s` of silence: a proxy does not cut
    an idle follow, and a browser that went away is noticed at the next write (the write
    fails and the stream, with its follower, is closed)."""
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for event in events:
                await queue.put(event)
        finally:
            await queue.put(None)

    task = asyncio.get_running_loop().create_task(pump())
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), every_s)
            except TimeoutError:
                yield ": still following\n\n"
                continue
            if event is None:
                task.result()  # its failure, if any, is the stream's
                return
            yield event
    finally:
        await stop_tasks([task], _SHUTDOWN_TIMEOUT_S)


async def connect_nats(settings: Settings) -> NATS:
    """The worker's reconnecting connection (`worker.bus.connections.connect_nats`) under the
    console's name: the console lives as long as a worker, unlike a command's one-shot
    connection."""
    return await connect(settings, name="aip-hermes-console")


class Console:
    """`aip-hermes-worker console`: start, serve until signalled, stop cleanly."""

    def __init__(self, settings: Settings, console: ConsoleSettings) -> None:
        self.settings = settings
        self.console = console
        self.port: int | None = None
        self.nc: NATS | None = None
        self.redis: Any = None
        self._served: Served | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.console.console_host}:{self.port}"

    async def start(self) -> None:
        # Configuration first: a bad file stops the console before it touches the bus.
        tokens = ConsoleTokens.load(self.console.console_tokens_file)
        trusted = believed_worker_keys(self.settings, "results, escalations and DLQ entries")
        self.nc = await connect_nats(self.settings)
        self.redis = open_redis_for(self.settings)
        reader = ConsoleReader(
            self.nc,
            self.redis,
            Subjects(self.settings.subject_prefix),
            trusted,
            max_runs=self.console.console_max_runs,
        )
        await self._serve(ConsoleHttp(reader, tokens).app())
        log.info("%s on %s (%d tokens)", READY_MARK, self.base_url, len(tokens))

    async def _serve(self, app: Any) -> None:
        self._served = served = await Served.start(
            app,
            host=self.console.console_host,
            port=self.console.console_port,
            backlog=128,
            port_settings=PORT_SETTINGS,
            lifespan="off",
        )
        self.port = served.port

    async def stop(self) -> None:
        served, self._served = self._served, None
        if served is not None:
            await served.stop(_SHUTDOWN_TIMEOUT_S)
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()
            self.redis = None
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.drain()
            self.nc = None

    async def run_until_signalled(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await self.start()
            await stop.wait()
            log.info("console stopping")
        finally:
            await self.stop()
