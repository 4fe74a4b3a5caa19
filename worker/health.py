"""`/health`, `/ready` and `/metrics` on one small HTTP server per worker.

`/health` answers 200 while the process serves HTTP at all: an orchestrator restarts the
container when it stops. `/ready` answers 200 only when this worker can do useful work
now: NATS connected, Redis answering PING within a second, every pull consumer bound,
every endpoint's Hermes answering the protected `GET /v1/models` (which proves the URL
*and* the API key), nothing missing that serving needs (`worker/serving.py`), and JetStream
storing what this worker publishes (`worker/bus/publish_health.py`: a full store fails
publishes while the connection stays up). Anything
else is 503 with the same JSON body, whose per-check booleans say what is wrong and whose
`reasons` say, one line per missing piece, which setting to fix. A load balancer or
compose health check takes the worker out of rotation on 503; nothing here ever stops the
worker, because every dependency is retried by the runtime itself and readiness returns as
soon as they are back.

The server knows the runtime only through `ReadinessProbe`, so it can be tested with any
object that answers those questions, and the runtime's internals stay free to change.
The Hermes check is cached for `hermes_cache_s` (a scrape every second must not become a
models request per second on every endpoint), the others are cheap and always fresh.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from worker.dependencies import METRICS_PORT_SETTINGS, port_in_use
from worker.hermes.http_client import PROBE_HEADER, HermesClient
from worker.metrics import Metrics

log = logging.getLogger(__name__)

#: Redis must answer PING within this long to count as ready.
REDIS_PING_TIMEOUT_S = 1.0
#: A Hermes models read that takes longer than this counts as unreachable.
HERMES_TIMEOUT_S = 3.0
#: How long one Hermes check result is reused.
HERMES_CACHE_S = 5.0

#: An async check: True when the dependency answered; it may also raise (counted as False).
AsyncCheck = Callable[[], Awaitable[bool]]


class ReadinessProbe(Protocol):
    """What `/ready` asks the running worker; each answer must be cheap or bounded."""

    def nats_connected(self) -> bool:
        """Whether the NATS connection is up (not reconnecting, not closed)."""
        ...

    def consumers_bound(self) -> Mapping[str, bool]:
        """Durable consumer name -> bound now; empty means none started yet (not ready)."""
        ...

    async def redis_ping(self) -> bool:
        """One PING; the server bounds it with `REDIS_PING_TIMEOUT_S`."""
        ...

    def hermes_checks(self) -> Mapping[str, AsyncCheck]:
        """Endpoint id -> a check that reads the protected models route."""
        ...

    def serving_reasons(self) -> tuple[bool, list[str]]:
        """Whether every endpoint may be served, and every reason one cannot (each naming
        the setting to fix; `worker/serving.py`)."""
        ...

    def publish_failure(self) -> str | None:
        """None while JetStream stores this worker's publishes; else the reason line."""
        ...


@dataclass(slots=True)
class CallbackProbe:
    """A `ReadinessProbe` from plain callables: how `Worker.start()` describes itself."""

    nats: Callable[[], bool]
    consumers: Callable[[], Mapping[str, bool]]
    redis: AsyncCheck
    hermes: Mapping[str, AsyncCheck] = field(default_factory=dict)
    serving: Callable[[], tuple[bool, list[str]]] = lambda: (True, [])
    publishing: Callable[[], str | None] = lambda: None

    def nats_connected(self) -> bool:
        return self.nats()

    def consumers_bound(self) -> Mapping[str, bool]:
        return self.consumers()

    async def redis_ping(self) -> bool:
        return await self.redis()

    def hermes_checks(self) -> Mapping[str, AsyncCheck]:
        return self.hermes

    def serving_reasons(self) -> tuple[bool, list[str]]:
        return self.serving()

    def publish_failure(self) -> str | None:
        return self.publishing()


def hermes_models_check(client: HermesClient, *, timeout_s: float = HERMES_TIMEOUT_S) -> AsyncCheck:
    """A check that sends the protected `GET /v1/models`: reachable *and* the key accepted."""

    async def check() -> bool:
        await client.request_json(
            "GET", "/v1/models", protected=True, total_timeout_s=timeout_s,
            headers={PROBE_HEADER: "ready"},
        )
        return True

    return check


def redis_ping_check(redis: Any) -> AsyncCheck:
    """A check over a redis-py asyncio client (standalone or cluster)."""

    async def check() -> bool:
        return bool(await redis.ping())

    return check


@dataclass(slots=True)
class _Cached:
    ok: bool
    at: float


class Readiness:
    """Evaluates the probe into the `/ready` document; caches the Hermes checks."""

    def __init__(
        self,
        probe: ReadinessProbe,
        *,
        metrics: Metrics | None = None,
        hermes_cache_s: float = HERMES_CACHE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe = probe
        self.metrics = metrics
        self.hermes_cache_s = hermes_cache_s
        self._clock = clock
        self._hermes: dict[str, _Cached] = {}
        self._refreshing: dict[str, asyncio.Task[bool]] = {}

    async def evaluate(self) -> dict[str, object]:
        """`{"ready": bool, "checks": {...}, "consumers": {...}, "hermes": {...}}`."""
        consumers = dict(self.probe.consumers_bound())
        checks_hermes = self.probe.hermes_checks()
        redis_ok, *hermes_ok = await asyncio.gather(
            _bounded(self.probe.redis_ping, REDIS_PING_TIMEOUT_S),
            *(self._hermes_ok(endpoint, check) for endpoint, check in checks_hermes.items()),
        )
        hermes = dict(zip(checks_hermes, hermes_ok, strict=True))
        servable, reasons = self.probe.serving_reasons()
        publish_failure = self.probe.publish_failure()
        if publish_failure is not None:
            reasons = [*reasons, publish_failure]
        checks = {
            "nats_connected": self.probe.nats_connected(),
            "redis": redis_ok,
            "consumers_bound": bool(consumers) and all(consumers.values()),
            "hermes": bool(hermes) and all(hermes.values()),
            "serving": servable,
            "jetstream_publish": publish_failure is None,
        }
        if self.metrics is not None:
            for name, ok in checks.items():
                self.metrics.readiness(name, ok)
        return {
            "ready": all(checks.values()),
            "checks": checks,
            "reasons": reasons,
            "consumers": consumers,
            "hermes": hermes,
        }

    async def _hermes_ok(self, endpoint: str, check: AsyncCheck) -> bool:
        cached = self._hermes.get(endpoint)
        if cached is not None and self._clock() - cached.at < self.hermes_cache_s:
            return cached.ok
        # Concurrent scrapes share one request instead of each sending their own.
        task = self._refreshing.get(endpoint)
        if task is None:
            task = asyncio.ensure_future(_bounded(check, HERMES_TIMEOUT_S + 1.0))
            self._refreshing[endpoint] = task
            task.add_done_callback(lambda _: self._refreshing.pop(endpoint, None))
        ok = await asyncio.shield(task)
        self._hermes[endpoint] = _Cached(ok, self._clock())
        return ok


async def _bounded(check: AsyncCheck, timeout_s: float) -> bool:
    """True only when the check answered True in time; any failure is a plain False."""
    try:
        async with asyncio.timeout(timeout_s):
            return bool(await check())
    except Exception as exc:  # readiness reports failures, it never raises them
        log.debug("readiness check failed: %s", type(exc).__name__)
        return False


class HealthServer:
    """The aiohttp server; `start()` binds (port 0 picks a free one), `stop()` closes it."""

    def __init__(
        self,
        probe: ReadinessProbe,
        metrics: Metrics,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        hermes_cache_s: float = HERMES_CACHE_S,
        before_scrape: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.metrics = metrics
        #: Brings gauges read from other stores up to date; must bound its own wait.
        self.before_scrape = before_scrape
        self.readiness = Readiness(probe, metrics=metrics, hermes_cache_s=hermes_cache_s)
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> None:
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        self._runner = runner
        # The bound address tells the real port when 0 was asked for.
        self.port = int(runner.addresses[0][1])
        log.info("health and metrics on http://%s:%d (/health /ready /metrics)",
                 self.host, self.port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"alive": True})

    async def _ready(self, _: web.Request) -> web.Response:
        document = await self.readiness.evaluate()
        return web.Response(
            status=200 if document["ready"] else 503,
            text=json.dumps(document),
            content_type="application/json",
        )

    async def _metrics(self, _: web.Request) -> web.Response:
        if self.before_scrape is not None:
            await self.before_scrape()
        body, content_type = self.metrics.render()
        # aiohttp wants the charset apart from the media type.
        media, _sep, params = content_type.partition(";")
        charset = params.split("charset=")[-1].strip() if "charset=" in params else None
        return web.Response(body=body, content_type=media.strip(), charset=charset)


async def start_health_server(
    probe: ReadinessProbe,
    metrics: Metrics,
    *,
    host: str,
    port: int | None,
    before_scrape: Callable[[], Awaitable[None]] | None = None,
) -> HealthServer | None:
    """The server for `Settings.metrics_host/metrics_port`; None when the port is unset."""
    if port is None:
        return None
    server = HealthServer(probe, metrics, host=host, port=port, before_scrape=before_scrape)
    try:
        await server.start()
    except OSError as exc:
        raise port_in_use(exc, host=host, port=port, settings=METRICS_PORT_SETTINGS) from None
    return server
