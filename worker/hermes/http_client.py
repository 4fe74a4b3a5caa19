"""HTTP calls to one Hermes endpoint.

One shared `httpx.AsyncClient` per endpoint (a client per request would cost ~0.8 MiB and a
TLS context each), over the `httpx-aiohttp` transport, measured here at about 7x the stock
transport's throughput at 100 concurrent streams; the stock transport stays selectable.
The two requests every operator Action makes, its start (`exchange`) and its event stream
(`stream_sse`), go by default (`h1`) to the worker's own HTTP/1.1 pool (`worker.hermes.h1`,
~14 % of an Action's CPU on aiohttp); with `aiohttp` they go to the transport's aiohttp
session itself (`_open_over_aiohttp`), so a held run keeps aiohttp's response only, not an
httpx request and response beside it. Redirects are never followed (3xx is `remote_rejected`), so
the bearer key never reaches another origin. Every failure leaves as a typed
`ConnectorError` naming the route template only: never the concrete URL, the provider's body
or the key; how each status and transport ending is typed is `worker.hermes.exchange`. Every
finished exchange is reported to the hook the app wires (`on_exchange`: the audit receipt),
so this package knows nothing of the audit log.

Failures are raised *outside* the `except` block that caught the lower-layer exception, so
the ConnectorError has no `__context__`: a traceback of it cannot show an httpx request, a
header or a provider message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import AbstractContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import aiohttp
import httpx
import msgspec
from httpx_aiohttp import AiohttpTransport
from multidict import istr

from schemas.errors import ErrorCode
from worker import tracing
from worker.endpoints import Endpoint
from worker.errors import (
    NEVER_SENT,
    ConnectorError,
    HttpPoolError,
    SSEDecodeError,
    SSEIdle,
    SSELimitReached,
    deadline_exceeded,
)
from worker.hermes.exchange import (
    Answer,
    Exchange,
    ExchangeHook,
    answer_of,
    from_http_status,
    from_transport,
)
from worker.hermes.features import NO_FEATURES, HermesFeatures
from worker.hermes.h1 import H1_ENCODINGS, H1Pool, H1Response
from worker.hermes.sse import SSEEvent, SSELimits, aiter_events
from worker.metrics import Metrics

Transport = Literal["h1", "aiohttp", "httpx"]
#: An open streamed response: httpx's (the stock transport, and one-shot requests) or, for
#: starts and event streams, the `h1` pool's or aiohttp's own (`HermesClient._open`).
StreamedResponse = httpx.Response | aiohttp.ClientResponse | H1Response

_json_decoder = msgspec.json.Decoder()
MAX_JSON_BODY_BYTES = 16 * 1024 * 1024
#: Enough for Hermes' error envelope; a larger 503 body is not a refusal we recognise.
MAX_REFUSAL_BYTES = 4096
#: What a lower layer may raise while a request or stream is in flight. aiohttp errors that
#: the httpx-aiohttp transport does not map arrive unmapped; OSError covers sockets.
_TRANSPORT_ERRORS = (
    httpx.HTTPError,
    httpx.StreamError,
    aiohttp.ClientError,
    OSError,
    HttpPoolError,
)


@dataclass(frozen=True, slots=True)
class HermesResponse:
    status: int
    body: Any
    headers: httpx.Headers


def route_path(route: str, params: Mapping[str, str]) -> str:
    """Fill a route template; each value is path-quoted so input cannot add segments."""
    path = route
    for name, value in params.items():
        path = path.replace("{" + name + "}", quote(str(value), safe=""))
    if "{" in path:
        raise ConnectorError(
            ErrorCode.CONFIGURATION_OR_INPUT, f"route {route} is missing a path parameter"
        )
    return path


class SSEStream:
    """The events of one open stream; iterate it once.

    Failures while reading are typed: the event limit is `stream_truncated`, an over-size or
    undecodable frame is `transport` (decode failure), a connection that breaks off after
    the stream opened is `stream_incomplete` (like a clean close without a terminal event),
    and so is a stream that keeps sending bytes but no event past the idle bounds.
    """

    __slots__ = ("_body", "_limits", "_what", "headers", "status")

    def __init__(
        self,
        what: str,
        status: int,
        headers: Mapping[str, str],
        body: AsyncIterator[bytes],
        limits: SSELimits,
    ) -> None:
        self._what = what
        self._body = body
        self._limits = limits
        self.status = status
        self.headers = headers

    def __aiter__(self) -> AsyncGenerator[SSEEvent, None]:
        return self.events()

    async def events(self) -> AsyncGenerator[SSEEvent, None]:
        """The parsed events; use with `contextlib.aclosing` when leaving early."""
        failure: ConnectorError
        events = aiter_events(self._body, self._limits)
        try:
            # One `async for` around the whole stream rather than a guarded `anext` per
            # event: only the reading raises these (a consumer's own errors are never
            # thrown into this generator at its `yield`).
            async for event in events:
                yield event
                del event  # not kept while the next one is awaited (a held run waits there)
            return
        except SSELimitReached:
            failure = ConnectorError(
                ErrorCode.STREAM_TRUNCATED,
                f"{self._what} passed the {self._limits.max_events}-event limit",
            )
        except SSEDecodeError as exc:
            failure = ConnectorError(
                ErrorCode.TRANSPORT, f"{self._what} stream decode failure: {exc}"
            )
        except SSEIdle as exc:
            failure = ConnectorError(
                ErrorCode.STREAM_INCOMPLETE, f"{self._what} stream ended: {exc}"
            )
        except _TRANSPORT_ERRORS as exc:
            # The stream was open and well-formed; it ended (cut, or silent past the
            # read timeout) before its terminal event: incomplete, never retryable.
            failure = ConnectorError(
                ErrorCode.STREAM_INCOMPLETE,
                f"{self._what} stream broke off: {type(exc).__name__}",
            )
        finally:
            # Closed here whatever way this ends, early included (the operator leaves at the
            # run's terminal event): left to the garbage collector, the parser's close would
            # be one more task the event loop's finalizer hook starts per Action.
            await events.aclose()
        raise failure


#: Bytes asked of aiohttp per read of a streamed body (what httpx-aiohttp asks for too).
_READ_BYTES = 16 * 1024


def _body(response: StreamedResponse) -> AsyncIterator[bytes]:
    """The body's bytes: the transport's own stream when there is nothing to decode.

    Event streams are asked for without compression (`stream_sse`), so their bodies arrive
    as sent and httpx's decoding layers (two async generators, a byte chunker and a decoder
    per response) would only copy them: per held run that was ~3 KiB (bench figure 4) and
    a generator hop per chunk (figure 3). A body that is encoded anyway is decoded (aiohttp
    decodes its own responses, `_open_over_aiohttp`).
    """
    if isinstance(response, H1Response):
        return response.iter_chunked()
    if isinstance(response, aiohttp.ClientResponse):
        return response.content.iter_chunked(_READ_BYTES)
    if "content-encoding" in response.headers or not isinstance(
        response.stream, httpx.AsyncByteStream
    ):
        return response.aiter_bytes()
    return aiter(response.stream)


#: Connections to one endpoint. An Action holds at most one at a time (its POST, then its
#: event stream), so this must not be below the Actions one worker may run against one
#: endpoint: at 512, a worker holding 2,000 operator runs on two endpoints (benchmark
#: figure 4) could open only ~1,024 event streams, and every start past the pool waited
#: out the pool timeout and settled `outcome_unknown`. 2,048 covers the endpoint
#: capacity's ceiling (1,000 open runs per endpoint) with room for status reads.
DEFAULT_MAX_CONNECTIONS = 2_048


#: Header names `HermesClient._name` remembers (a client sends a handful).
MAX_REMEMBERED_HEADER_NAMES = 64


#: Marks a request the worker sends only to learn whether Hermes accepts its key (the
#: serving gate and `/ready`); Hermes ignores it, the fake counts such requests apart.
PROBE_HEADER = "X-AIP-Probe"


class HermesClient:
    """Requests to one endpoint; safe to share across every Action the worker runs."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        transport: Transport = "h1",
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        metrics: Metrics | None = None,
        on_exchange: ExchangeHook | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.metrics = metrics
        #: Told of every finished exchange (the app wires the audit receipt here).
        self.on_exchange = on_exchange
        #: What this endpoint's Hermes advertised beyond 0.19 (`worker/hermes/features.py`,
        #: refreshed by the serving probe); nothing until read.
        self.features: HermesFeatures = NO_FEATURES
        d = endpoint.descriptor
        #: `read` is above Hermes' 30 s SSE keepalive (descriptor default 45 s), so a quiet
        #: but healthy stream is never cut; the Action deadline bounds the whole exchange.
        self.timeout = httpx.Timeout(
            connect=d.connect_timeout_ms / 1000,
            read=d.read_timeout_ms / 1000,
            write=d.connect_timeout_ms / 1000,
            pool=d.connect_timeout_ms / 1000,
        )
        self.total_timeout_s = d.total_timeout_ms / 1000
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        base_transport: httpx.AsyncBaseTransport
        if transport in ("h1", "aiohttp"):
            base_transport = AiohttpTransport(limits=limits, trust_env=False)
        else:
            base_transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)
        self.transport_name: Transport = transport
        self._transport = base_transport
        self._client = httpx.AsyncClient(
            base_url=endpoint.url,
            transport=base_transport,
            follow_redirects=False,
            timeout=self.timeout,
            trust_env=False,
        )
        # What `build_request` would merge into every request, computed once (`_build`).
        self._base_url = str(self._client.base_url).rstrip("/")
        # Less `connection: keep-alive`, HTTP/1.1's default: a header copied into every
        # request of every held run (httpx's request and aiohttp's) for nothing.
        self._default_headers = {
            k.lower(): v for k, v in self._client.headers.items() if k.lower() != "connection"
        }
        self._timeout_extension = {"timeout": self.timeout.as_dict()}
        #: The parsed URL of each route that has no path parameter (a fixed, small set:
        #: `POST /v1/runs` once per operator Action), so its text is parsed once, not on
        #: every request (~half of building an `httpx.Request` here).
        self._fixed_urls: dict[str, httpx.URL] = {}
        #: The timeouts httpx-aiohttp derives from `self.timeout` for each request, made
        #: once for the event streams sent on aiohttp directly (`_open_over_aiohttp`).
        self._aiohttp_timeout = aiohttp.ClientTimeout(
            sock_connect=self.timeout.connect,
            sock_read=self.timeout.read,
            connect=self.timeout.pool,
        )
        #: Header names as aiohttp's case-insensitive keys, made once each (`_names`).
        self._header_names: dict[str, istr] = {}
        #: The pool starts and event streams go to on the `h1` transport (`_open`).
        self._h1 = (
            H1Pool(
                endpoint.url,
                max_connections=max_connections,
                connect_timeout_s=self.timeout.connect or 0.0,
                read_timeout_s=self.timeout.read or 0.0,
                pool_timeout_s=self.timeout.pool or 0.0,
            )
            if transport == "h1"
            else None
        )

    def require_key(self, what: str) -> None:
        if self.endpoint.api_key is None:
            raise ConnectorError(
                ErrorCode.MISSING_CREDENTIAL,
                f"{what} is protected and endpoint {self.endpoint.id} has no API key",
            )

    def _build(
        self,
        method: str,
        route: str,
        params: Mapping[str, str] | None,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        protected: bool,
        accept: str,
    ) -> httpx.Request:
        """The request `AsyncClient.build_request` would make (the client's default headers,
        its timeouts), built directly: this client has no cookies, auth flow or per-request
        options to merge, and the merge was ~5% of an operator Action's CPU."""
        all_headers = self._headers(
            f"{method} {route}",
            headers,
            protected=protected,
            accept=accept,
            json_content=json_body is not None or content is not None,
        )
        if json_body is not None:
            content = msgspec.json.encode(json_body)
        encoded = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
        url: httpx.URL | str
        if params:
            url = self._base_url + route_path(route, params)
        else:
            url = self._fixed_urls.get(route) or self._fixed_url(route)
        return httpx.Request(
            method,
            url,
            params=encoded or None,
            headers=all_headers,
            content=content,
            extensions=self._timeout_extension,
        )

    def _fixed_url(self, route: str) -> httpx.URL:
        url = self._fixed_urls[route] = httpx.URL(self._base_url + route_path(route, {}))
        return url

    def _headers(
        self,
        what: str,
        headers: Mapping[str, str] | None,
        *,
        protected: bool,
        accept: str,
        json_content: bool,
    ) -> dict[str, str]:
        """Every header of one request: the client's defaults, the caller's, then ours."""
        if protected:
            self.require_key(what)
        # Caller headers first, ours last: nothing a caller passes can replace the key,
        # the content type or what we accept.
        all_headers = dict(self._default_headers)
        for name, value in (headers or {}).items():
            all_headers[name.lower()] = value
        all_headers["accept"] = accept
        tracing.inject(all_headers)  # the request's span (`_span`), Hermes's parent
        if json_content:
            all_headers["content-type"] = "application/json"
        if protected:
            key = self.endpoint.api_key
            if key is not None:
                all_headers["authorization"] = f"Bearer {key.reveal()}"
        return all_headers

    def _aiohttp_session(self) -> aiohttp.ClientSession | None:
        """The aiohttp session under the httpx-aiohttp transport (made as that transport
        makes it on its first request, and then shared with it: one connection pool);
        None on the stock transport."""
        transport = self._transport
        if not isinstance(transport, AiohttpTransport):
            return None
        if not isinstance(transport.client, aiohttp.ClientSession):
            transport.client = transport.get_client()
        return transport.client

    async def _open_over_aiohttp(
        self,
        session: aiohttp.ClientSession,
        method: str,
        target: str,
        content: bytes | None,
        headers: dict[str, str],
    ) -> aiohttp.ClientResponse:
        """Send a request on aiohttp itself, as httpx-aiohttp would send the `httpx.Request`
        `_build` makes (same URL, headers, body and timeouts; no redirect followed), without
        an httpx request and response beside aiohttp's: for an event stream that was ~4 KiB
        per held run (bench figure 4), for the operator's start ~10% of an Action's CPU."""
        return await session.request(
            method,
            self._base_url + target,
            headers={self._name(name): value for name, value in headers.items()},
            data=content,
            allow_redirects=False,
            timeout=self._aiohttp_timeout,
        )

    @staticmethod
    def _target(
        route: str, params: Mapping[str, str] | None, query: Mapping[str, Any] | None
    ) -> str:
        """The request target below the endpoint's base path, its query encoded as httpx
        encodes one, so every transport sends the request httpx would."""
        path = route_path(route, params or {})
        encoded = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
        return f"{path}?{httpx.QueryParams(encoded)}" if encoded else path

    def _name(self, name: str) -> istr:
        """`name` as an `istr`, made once: aiohttp keeps a request's headers for the
        response's life, and a plain `str` name costs a lowercased copy of it per header
        per request there (~0.5 KiB per held stream); an `istr` carries its own. The names
        are this client's and the caller's few fixed ones; the memo stops growing at 64."""
        known = self._header_names.get(name)
        if known is not None:
            return known
        made = istr(name)
        if len(self._header_names) < MAX_REMEMBERED_HEADER_NAMES:
            self._header_names[name] = made
        return made

    async def send(self, request: httpx.Request) -> httpx.Response:
        """Send a request built by `_build` straight to the transport; the response streams.

        `AsyncClient.send` wraps the transport in what this client never uses: the auth
        flow, redirect handling (off), the cookie jar (Hermes sets no cookies) and event
        hooks, ~7% of an operator Action's CPU on the benchmark machine. The caller reads
        and closes the response, as after `AsyncClient.send(..., stream=True)`.
        """
        response = await self._transport.handle_async_request(request)
        response.request = request
        return response

    async def exchange(
        self,
        method: str,
        route: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout_s: float,
        max_body_bytes: int,
        params: Mapping[str, str] | None = None,
    ) -> Exchange:
        """One request with a JSON body already encoded, sent once, whose every ending is an
        `Exchange` (cancellation aside), never an exception: the operator's unsafe start,
        which must tell "never sent" from "may have run". The answer's body is kept up to
        `max_body_bytes` (a larger one is None).

        Over the aiohttp transport the request goes to aiohttp itself (`_open`): building
        and answering an httpx request and response around aiohttp's was about a tenth of
        an operator Action's CPU (bench figure 1)."""
        with self._span(method, route):
            started = time.monotonic()
            status: int | None = None
            raw: bytes | None = b""
            response_headers: Mapping[str, str] = {}
            failure: str | None = None
            try:
                async with asyncio.timeout(timeout_s):
                    response = await self._open(
                        method,
                        route,
                        params,
                        content=body,
                        query=None,
                        headers=headers,
                        protected=True,
                        accept="application/json",
                    )
                    try:
                        raw = await _read_bounded(response, max_body_bytes)
                    finally:
                        await _close(response)
                status, response_headers = _status(response), response.headers
                code = error_code_of(raw) if status == 503 and raw is not None else None
                answer = answer_of(status, code)
            except (TimeoutError, *_TRANSPORT_ERRORS) as exc:
                answer, failure = _answer_of_failure(exc, self.transport_name)
            exchange = Exchange(
                endpoint_id=self.endpoint.id,
                method=method,
                route=route,
                answer=answer,
                status=status,
                seconds=time.monotonic() - started,
                body=raw if status is not None else b"",
                headers=response_headers,
                failure=failure,
            )
            self._report(exchange)
            return exchange

    async def request_json(
        self,
        method: str,
        route: str,
        params: Mapping[str, str] | None = None,
        *,
        json_body: Any = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        protected: bool = True,
        total_timeout_s: float | None = None,
    ) -> HermesResponse:
        """One non-streaming request: a 2xx with a JSON (or empty) body, or a ConnectorError.

        `total_timeout_s` is the Action's remaining time: passing it is `deadline_exceeded`.
        The endpoint's own total timeout, when it is the shorter bound, is a transport failure.
        """
        with self._span(method, route):
            what = f"{method} {route}"
            request = self._build(
                method,
                route,
                params,
                json_body=json_body,
                query=query,
                headers=headers,
                protected=protected,
                accept="application/json",
            )
            by_deadline = total_timeout_s is not None and total_timeout_s <= self.total_timeout_s
            budget = (
                self.total_timeout_s
                if total_timeout_s is None
                else min(total_timeout_s, self.total_timeout_s)
            )
            if budget <= 0:
                raise deadline_exceeded(what)
            failure: ConnectorError | None = None
            try:
                async with asyncio.timeout(budget):
                    status, raw, response_headers = await self._exchange(
                        what, request, method, route
                    )
            except TimeoutError:
                failure = (
                    deadline_exceeded(what)
                    if by_deadline
                    else ConnectorError(ErrorCode.TRANSPORT, f"{what} timed out")
                )
            except _TRANSPORT_ERRORS as exc:
                failure = from_transport(exc, what)
            if failure is not None:
                raise failure
            if not raw.strip():
                return HermesResponse(status, None, response_headers)
            try:
                body = _json_decoder.decode(raw)
            except msgspec.DecodeError:
                failure = ConnectorError(
                    ErrorCode.TRANSPORT, f"{what} answered a body that is not JSON"
                )
            if failure is not None:
                raise failure
            return HermesResponse(status, body, response_headers)

    async def _exchange(
        self, what: str, request: httpx.Request, method: str, route: str
    ) -> tuple[int, bytes, httpx.Headers]:
        started = time.monotonic()
        status: int | None = None
        try:
            response = await self.send(request)
        except BaseException:
            self._finished(method, route, None, started)
            raise
        status = response.status_code
        try:
            if not 200 <= response.status_code < 300:
                # The provider body is never kept: it may echo input or secrets.
                raise from_http_status(
                    response.status_code, what, error_code=await refusal_code(response)
                )
            body = await _read_bounded(response, MAX_JSON_BODY_BYTES)
            if body is None:
                raise ConnectorError(ErrorCode.TRANSPORT, f"{what} answered an over-size body")
            return response.status_code, body, response.headers
        finally:
            await response.aclose()
            self._finished(method, route, status, started)

    def _finished(self, method: str, route: str, status: int | None, started: float) -> None:
        """Report a streamed or JSON exchange (no status: it got no answer)."""
        self._report(
            Exchange(
                endpoint_id=self.endpoint.id,
                method=method,
                route=route,
                answer=Answer.LOST if status is None else answer_of(status),
                status=status,
                seconds=time.monotonic() - started,
            )
        )

    def _span(self, method: str, route: str) -> AbstractContextManager[tracing.Span | None]:
        """The client span of one request to Hermes, named by its route template (never
        its path: ids stay out of span names); the no-op context when untraced."""
        if not tracing.enabled():
            return tracing.NO_SPAN
        return tracing.span(
            f"{method} {route}",
            kind="client",
            attributes={
                "http.request.method": method,
                "url.template": route,
                "server.address": urlsplit(self._base_url).hostname or "",
                "aip.endpoint": self.endpoint.id,
                "gen_ai.provider.name": "hermes",
            },
        )

    def _report(self, exchange: Exchange) -> None:
        """Every finished exchange, once: the metrics, the request's span, the app's hook."""
        if tracing.enabled():
            tracing.annotate(
                {"http.response.status_code": exchange.status or 0},
                error=None if exchange.answer is Answer.OK else exchange.answer.value,
            )
        if self.metrics is not None:
            self.metrics.provider_call(
                self.endpoint.id, exchange.method, exchange.route, exchange.status,
                exchange.seconds,
            )  # fmt: skip
        if self.on_exchange is not None:
            self.on_exchange(exchange)

    async def _open(
        self,
        method: str,
        route: str,
        params: Mapping[str, str] | None,
        *,
        content: bytes | None,
        query: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        protected: bool,
        accept: str,
    ) -> StreamedResponse:
        """Send a request whose body (JSON, if any) is already encoded; the response is
        open, its body unread.

        On the `h1` transport the request goes to the worker's own HTTP/1.1 pool, on the
        aiohttp one to aiohttp itself (`_open_over_aiohttp`): either way its request,
        headers and body are temporaries of this call, so a held stream keeps none of them
        beside the response, and a start builds no httpx objects."""
        pool, session = self._h1, None
        if pool is None and (session := self._aiohttp_session()) is None:
            return await self.send(
                self._build(
                    method,
                    route,
                    params,
                    content=content,
                    query=query,
                    headers=headers,
                    protected=protected,
                    accept=accept,
                )
            )
        all_headers = self._headers(
            f"{method} {route}",
            headers,
            protected=protected,
            accept=accept,
            json_content=content is not None,
        )
        target = self._target(route, params, query)
        if session is not None:
            return await self._open_over_aiohttp(session, method, target, content, all_headers)
        assert pool is not None
        if all_headers.get("accept-encoding", "identity") != "identity":
            # What the pool decodes (httpx offers br and zstd when their packages exist).
            all_headers["accept-encoding"] = H1_ENCODINGS
        return await pool.open(method, target, all_headers.items(), content)

    async def _open_stream(
        self,
        method: str,
        route: str,
        params: Mapping[str, str] | None,
        *,
        json_body: Any,
        query: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        protected: bool,
    ) -> StreamedResponse:
        """Send an event stream's request (`_open`), asked for uncompressed, so its body is
        read as it arrives (`_body`)."""
        return await self._open(
            method,
            route,
            params,
            content=msgspec.json.encode(json_body) if json_body is not None else None,
            query=query,
            headers={**(headers or {}), "accept-encoding": "identity"},
            protected=protected,
            accept="text/event-stream",
        )

    @asynccontextmanager
    async def stream_sse(
        self,
        method: str,
        route: str,
        params: Mapping[str, str] | None = None,
        *,
        json_body: Any = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        limits: SSELimits | None = None,
        protected: bool = True,
    ) -> AsyncIterator[SSEStream]:
        """Open an event stream; a non-2xx or non-SSE answer raises before anything is yielded.

        The caller bounds the total duration (the Action deadline); the read timeout only
        catches a server that stopped sending even keepalives. Leaving the block closes the
        connection, which is how Hermes learns the client went away.
        """
        with self._span(method, route):
            what = f"{method} {route}"
            failure: ConnectorError | None = None
            started = time.monotonic()
            response: StreamedResponse
            try:
                response = await self._open_stream(
                    method,
                    route,
                    params,
                    json_body=json_body,
                    query=query,
                    headers=headers,
                    protected=protected,
                )
            except _TRANSPORT_ERRORS as exc:
                failure = from_transport(exc, what)
            if failure is not None:
                self._finished(method, route, None, started)
                raise failure
            status = _status(response)
            try:
                if not 200 <= status < 300:
                    raise from_http_status(status, what, error_code=await refusal_code(response))
                content_type = response.headers.get("content-type", "")
                if not content_type.startswith("text/event-stream"):
                    raise ConnectorError(
                        ErrorCode.TRANSPORT, f"{what} answered 2xx without an event stream"
                    )
                yield SSEStream(
                    what, status, response.headers, _body(response), limits or SSELimits()
                )
            finally:
                await _close_quietly(response)
                self._finished(method, route, status, started)

    async def aclose(self) -> None:
        if self._h1 is not None:
            await self._h1.aclose()
        await self._client.aclose()

    def __repr__(self) -> str:
        return (
            f"HermesClient(endpoint={self.endpoint.id!r}, url={self.endpoint.url!r}, "
            f"transport={self.transport_name!r})"
        )


def _query_value(value: Any) -> Any:
    """Booleans as Hermes parses them (`true`/`false`); everything else as httpx encodes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _pieces(response: StreamedResponse) -> AsyncIterator[bytes]:
    """A response's body, decoded, piece by piece, whichever client's response it is."""
    if isinstance(response, H1Response):
        return response.iter_chunked()
    if isinstance(response, aiohttp.ClientResponse):
        return response.content.iter_chunked(_READ_BYTES)
    return response.aiter_bytes()


async def _read_bounded(response: StreamedResponse, limit: int) -> bytes | None:
    """The body, or None as soon as it passes `limit` bytes (the rest is never read)."""
    raw = bytearray()
    async for piece in _pieces(response):
        raw += piece
        if len(raw) > limit:
            return None
    return bytes(raw)


def _answer_of_failure(exc: BaseException, transport: str) -> tuple[Answer, str | None]:
    """How an exchange that raised `exc` ended, and the failure's name (None for our own
    deadline). `asyncio.timeout`'s TimeoutError is the deadline (the `h1` pool's own timeouts
    are not TimeoutErrors); aiohttp's own timeouts (no
    connection within the connect timeout, a read timeout) are TimeoutErrors too, but they
    are transport failures, and which one it was decides "never sent" from "may have run"."""
    if isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ClientError):
        return Answer.TIMED_OUT, None
    return (Answer.NOT_SENT if _never_sent(exc, transport) else Answer.LOST), type(exc).__name__


def _never_sent(exc: BaseException, transport: str) -> bool:
    """True only when the request provably never reached the wire: no connection could be
    had (pool wait, connect refused or timed out). Anything after a connection existed (a
    disconnect, a read error) may have delivered it, so it stays unknown.

    The stock transport raises `ConnectError`/`ConnectTimeout`/`PoolTimeout` only before
    sending. httpx-aiohttp maps every `aiohttp.ClientConnectionError`, including a server
    disconnect after the request, to `ConnectTimeout`, so there the aiohttp cause decides:
    `ClientConnectorError` (connecting failed) or `ConnectionTimeoutError` (no connection
    within the connect timeout, pool wait included). The `h1` pool raises one of
    `NEVER_SENT` exactly when nothing was written.
    """
    if isinstance(exc, HttpPoolError):
        return isinstance(exc, NEVER_SENT)
    if isinstance(exc, httpx.PoolTimeout):
        return True
    if transport == "httpx":
        return isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    connecting = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
    return isinstance(exc, connecting) or isinstance(exc.__cause__, connecting)


def _status(response: StreamedResponse) -> int:
    if isinstance(response, httpx.Response):
        return response.status_code
    return response.status


async def refusal_code(response: StreamedResponse) -> str | None:
    """The `error.code` of a 503, the one status whose body tells whether Hermes refused
    before starting anything (`gateway_draining`); None for any other status or body.
    At most `MAX_REFUSAL_BYTES` are read and only the code is returned, never the body."""
    if _status(response) != 503:
        return None
    try:
        raw = await _read_bounded(response, MAX_REFUSAL_BYTES)
    except _TRANSPORT_ERRORS:
        return None
    return None if raw is None else error_code_of(raw)


def error_code_of(raw: bytes) -> str | None:
    """`error.code` of a Hermes error body (its OpenAI envelope), or None for any other
    body; nothing else of the body is read or returned (it may echo input or secrets)."""
    try:
        body = _json_decoder.decode(raw)
    except msgspec.DecodeError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


async def _close(response: StreamedResponse) -> None:
    """Let a response go. An aiohttp response is let go as httpx-aiohttp lets go of it (its
    `__aexit__`): a body not read to its end closes the connection, which tells Hermes the
    client left. An `h1` answer not read to its end closes its connection the same way."""
    if isinstance(response, H1Response):
        response.release()
    elif isinstance(response, aiohttp.ClientResponse):
        response.release()
        await response.wait_for_close()
    else:
        await response.aclose()


async def _close_quietly(response: StreamedResponse) -> None:
    """`_close` for a half-read stream, whose closing may itself fail on a broken socket;
    that is not news."""
    with suppress(*_TRANSPORT_ERRORS):
        await _close(response)
