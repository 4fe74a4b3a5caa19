"""The worker's own HTTP/1.1 client for the two requests every operator Action makes.

An operator Action sends `POST /v1/runs` and then reads the run's event stream; on
aiohttp those two requests were ~14 % of the worker's CPU per Action (bench figure 1:
`ClientSession._request` alone 7.7 %, with its request and response objects, cookie jar,
URL building, timers and stream reader), most of it machinery a client of one trusted
HTTP/1.1 endpoint never uses. Here a request is one formatted head written to a pooled
connection, and the answer is parsed by `httptools` (the llhttp parser uvicorn uses, from
the uvloop authors) straight into a status, case-insensitive headers and body pieces.

What it keeps of a full client, because the operator's guarantees rest on it:

- **"Never sent" is exact.** `HttpConnectError`, `HttpPoolTimeout`, `HttpConnectTimeout` and
  `HttpHeaderRefused` (`worker.errors.NEVER_SENT`) are raised only before any byte of the
  request was written: no slot in the pool within the pool timeout, no connection within
  the connect timeout, a header refused. Every
  failure after that (`HttpDisconnected`, `HttpReadTimeout`, `HttpProtocolError`) may have
  delivered the request, so the operator settles `outcome_unknown` for a start.
- **An idle connection is reused only while it is young** (`KEEPALIVE_S`, aiohttp's own
  keep-alive default, well under Hermes' 75 s): a start is never written to a connection
  the server is about to close, which would make it "may have run".
- **A body not read to its end closes the connection**, which is how Hermes learns the
  client left a stream; a connection goes back to the pool only after a whole answer that
  allows keep-alive.
- **Bounded**: at most `max_connections` sockets (pooled ones included); a stream that
  is read more slowly than it arrives stops the socket's reading past `HIGH_WATER` bytes;
  no byte for `read_timeout_s` while the reader waits is `HttpReadTimeout`.
- **No header injection**: a header name or value holding CR, LF or NUL is refused before
  anything is sent (`HttpHeaderRefused`, never sent).
- Redirects are never followed (a 3xx is an answer like any other), no proxy is used, TLS
  verifies the certificate and host name with the system's trust store (as aiohttp did).

Safe for one event loop only, like everything the worker shares across Actions.
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Final, cast
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from worker.errors import (
    HttpConnectError,
    HttpConnectTimeout,
    HttpDisconnected,
    HttpHeaderRefused,
    HttpPoolError,
    HttpPoolTimeout,
    HttpProtocolError,
    HttpReadTimeout,
)

#: Idle connections older than this are closed instead of reused (aiohttp's default).
KEEPALIVE_S: Final = 15.0
#: Buffered body bytes past which the socket stops being read until the reader catches up,
#: and the level at which it reads again.
HIGH_WATER: Final = 256 * 1024
LOW_WATER: Final = 64 * 1024
#: The content codings an answer may use (`Accept-Encoding` of a request that accepts any).
H1_ENCODINGS: Final = "gzip, deflate"


class H1Response:
    """One answer: its status and headers once they arrived, then its body, piece by piece.

    Read the body with `iter_chunked` or `read`, then `release` it: the connection serves
    another request when the whole answer arrived, and is closed otherwise (how the
    server learns the client left a stream)."""

    __slots__ = (
        "_complete",
        "_conn",
        "_error",
        "_pieces",
        "_pool",
        "_released",
        "_size",
        "_waiter",
        "headers",
        "status",
    )

    def __init__(self, pool: H1Pool, conn: _Connection) -> None:
        self._pool = pool
        self._conn = conn
        self.status = 0
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS
        self._pieces: deque[bytes] = deque()
        self._size = 0
        self._complete = False
        self._error: HttpPoolError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._released = False

    # -- fed by the connection -------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._pieces.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER:
            self._conn.pause()
        self._wake()

    def _finish(self, error: HttpPoolError | None) -> None:
        if self._complete or self._error is not None:
            return
        if error is None:
            self._complete = True
        else:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    @property
    def waiting(self) -> bool:
        """Whether the reader waits for bytes (only then does the read timeout run)."""
        return self._waiter is not None

    # -- read by the caller ----------------------------------------------------------

    async def iter_chunked(self) -> AsyncIterator[bytes]:
        """The body's pieces as they arrive (decoded when the server compressed it)."""
        decoder = _decoder_for(self.headers.get("Content-Encoding"))
        while True:
            piece = await self._next_piece()
            if piece is None:
                if decoder is not None:
                    tail = decoder.flush()
                    if tail:
                        yield tail
                return
            if decoder is not None:
                try:
                    piece = decoder.decompress(piece)
                except zlib.error:
                    raise HttpProtocolError("the compressed body does not decode") from None
                if not piece:
                    continue
            yield piece

    async def _next_piece(self) -> bytes | None:
        pieces = self._pieces
        while not pieces:
            if self._error is not None:
                raise self._error
            if self._complete:
                return None
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            self._conn.reading()
            await waiter
        piece = pieces.popleft()
        self._size -= len(piece)
        if self._size < LOW_WATER:
            self._conn.resume()
        return piece

    async def read(self, limit: int) -> bytes | None:
        """The whole body, or None as soon as it passes `limit` bytes (the rest unread)."""
        raw = bytearray()
        async for piece in self.iter_chunked():
            raw += piece
            if len(raw) > limit:
                return None
        return bytes(raw)

    def release(self) -> None:
        """Done with this answer: its connection serves the next request when the whole
        answer arrived and allows keep-alive, and is closed otherwise. Idempotent."""
        if self._released:
            return
        self._released = True
        # Whole answers only: pieces left unread are dropped, the connection is at the
        # boundary between two answers either way.
        self._pool._give_back(self._conn, reusable=self._complete)


_NO_HEADERS: Final[CIMultiDictProxy[str]] = CIMultiDictProxy(CIMultiDict())


def _decoder_for(encoding: str | None) -> zlib._Decompress | None:
    """A decompressor for a body the server compressed although nothing asked for it."""
    if encoding is None:
        return None
    name = encoding.strip().lower()
    if name in ("", "identity"):
        return None
    if name in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if name == "deflate":
        return zlib.decompressobj()
    raise HttpProtocolError(f"a body in an encoding this client cannot read ({name[:32]})")


class _Connection(asyncio.Protocol):
    """One socket to the endpoint, and the answer it is reading (at most one at a time)."""

    def __init__(self, pool: H1Pool) -> None:
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.response: H1Response | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._header_list: list[tuple[str, str]] = []
        self._headers_waiter: asyncio.Future[None] | None = None
        self._keep_alive = False
        self.lost = False
        self.paused = False
        self.idle_since = 0.0
        #: When the answer last sent a byte (or the request was written), and the timer
        #: that checks the read timeout against it (`_check_read`).
        self._last_byte = 0.0
        self._read_timeout_s = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:  # bytes on an idle connection: it cannot be trusted again
            self._abort()
            return
        self._last_byte = self._loop.time()
        try:
            parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail(HttpProtocolError("the answer is not HTTP/1.1"))
            self._abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._stop_timer()
        self._pool._forget(self)
        parser, self._parser = self._parser, None
        response = self.response
        if parser is None or response is None:  # idle, or the answer was whole
            return
        if self._headers_waiter is not None:  # no whole head yet
            self._fail(HttpDisconnected("the connection closed before the answer"))
        elif exc is None and _ends_with_close(response.headers):
            response._finish(None)  # a body without a length, not chunked, ends so
        else:
            response._finish(HttpDisconnected("the connection closed inside the body"))

    # -- httptools callbacks -----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._parser is None:  # bytes past the answer's end: ignored
            return
        self._header_list.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        parser, response = self._parser, self.response
        if parser is None or response is None:
            return
        status = parser.get_status_code()
        if 100 <= status < 200:  # an interim answer; the real one follows
            self._header_list = []
            return
        response.status = status
        response.headers = CIMultiDictProxy(CIMultiDict(self._header_list))
        self._header_list = []
        self._keep_alive = parser.should_keep_alive()
        waiter, self._headers_waiter = self._headers_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is not None and self._parser is not None:
            response._feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is None or self._parser is None or self._headers_waiter is not None:
            return  # the end of an interim answer, or bytes past the answer's end
        # The answer is whole: the next request gets a parser of its own, and any byte
        # before it makes the connection unusable (`data_received`).
        self._parser = None
        self._stop_timer()
        response._finish(None)

    # -- the request -----------------------------------------------------------------

    def send(self, head: bytes, body: bytes | None, read_timeout_s: float) -> H1Response:
        """Write one request; the answer's head is awaited with `head_received`."""
        assert self.transport is not None
        response = self.response = H1Response(self._pool, self)
        self._parser = httptools.HttpResponseParser(self)
        self._headers_waiter = self._loop.create_future()
        self._read_timeout_s = read_timeout_s
        self._last_byte = self._loop.time()
        self._arm(self._last_byte + read_timeout_s)
        self.transport.write(head + body if body else head)
        return response

    async def head_received(self) -> None:
        waiter = self._headers_waiter
        if waiter is not None:
            await waiter

    def _fail(self, error: HttpPoolError) -> None:
        waiter, self._headers_waiter = self._headers_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
            waiter.exception()  # retrieved here: the caller may be gone (cancelled)
        if self.response is not None:
            self.response._finish(error)

    # -- the read timeout ----------------------------------------------------------------

    def _arm(self, when: float) -> None:
        self._stop_timer()
        self._timer = self._loop.call_at(when, self._check_read)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_read(self) -> None:
        """Fires at the read deadline of the last byte: fails the answer when no byte came
        since and the reader is waiting for one (a paused or unread stream is not late)."""
        self._timer = None
        if self._parser is None:
            return
        now, deadline = self._loop.time(), self._last_byte + self._read_timeout_s
        response = self.response
        awaiting = self._headers_waiter is not None or (response is not None and response.waiting)
        if now < deadline or not awaiting:
            self._arm(max(deadline, now + self._read_timeout_s / 4))
            return
        self._fail(HttpReadTimeout("no byte of the answer within the read timeout"))
        self._abort()

    def reading(self) -> None:
        """The reader starts waiting: the read timeout counts from now at the earliest."""
        if self._parser is None:
            return
        self._last_byte = self._loop.time()
        if self._timer is None:
            self._arm(self._last_byte + self._read_timeout_s)

    # -- flow control and ending -----------------------------------------------------------

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.lost:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.lost:
            self.paused = False
            self.transport.resume_reading()

    def reusable(self) -> bool:
        return (
            not self.lost
            and self._keep_alive
            and self._parser is None
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def idle(self) -> None:
        """Back in the pool: nothing is expected on it until the next request."""
        self.response = None
        self._parser = None
        self._stop_timer()
        self.resume()
        self.idle_since = self._loop.time()

    def _abort(self) -> None:
        self._stop_timer()
        if self.transport is not None:
            self.transport.abort()


def _ends_with_close(headers: CIMultiDictProxy[str]) -> bool:
    """Whether an answer's body is delimited by the connection's end (no length, not
    chunked): only then is a close inside it the body's end."""
    return (
        "Content-Length" not in headers
        and "chunked" not in headers.get("Transfer-Encoding", "").lower()
    )


class H1Pool:
    """Keep-alive connections to one HTTP/1.1 origin, and requests over them."""

    def __init__(
        self,
        url: str,
        *,
        max_connections: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        pool_timeout_s: float,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("an absolute http:// or https:// url is required")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        #: The path every request's target starts with (an endpoint behind a prefix).
        self.base_path = parts.path.rstrip("/")
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = (host if default_port else f"{host}:{self.port}").encode("idna")
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.pool_timeout_s = pool_timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: deque[_Connection] = deque()
        self._open: set[_Connection] = set()
        self._closed = False

    async def open(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
    ) -> H1Response:
        """Send one request (`target`: the path and query below the base path) and return
        its answer once its status and headers arrived; the caller reads the body and
        releases it. Raises one of `NEVER_SENT` only when nothing was written."""
        head = self._head(method, target, headers, body)
        if self._closed:
            raise HttpConnectError("the client is closed")
        slots = self._slots
        if slots.locked():  # every slot taken: wait for one, for the pool timeout at most
            try:
                async with asyncio.timeout(self.pool_timeout_s):
                    await slots.acquire()
            except TimeoutError:
                raise HttpPoolTimeout("no connection slot within the pool timeout") from None
        else:
            await slots.acquire()  # free: taken at once
        conn: _Connection | None = None
        try:
            conn = self._reused() or await self._connect()
            response = conn.send(head, body, self.read_timeout_s)
            await conn.head_received()
            return response
        except BaseException:
            if conn is not None:
                self._give_back(conn, reusable=False)
            else:
                self._slots.release()
            raise

    def _head(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes | None
    ) -> bytes:
        lines = [f"{method} {self.base_path}{target} HTTP/1.1"]
        for name, value in headers:
            if _unsafe(name) or _unsafe(value) or ":" in name:
                raise HttpHeaderRefused(f"header {name[:40]!r} holds a character HTTP forbids")
            lines.append(f"{name}: {value}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        try:
            text = "\r\n".join(lines).encode("utf-8")
        except UnicodeEncodeError:
            raise HttpHeaderRefused("a header is not encodable text") from None
        return b"".join((text, b"\r\nHost: ", self._host_header, _HEAD_END))

    def _reused(self) -> _Connection | None:
        """The youngest idle connection still open, closing the ones past keep-alive."""
        idle = self._idle
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()
            if conn.reusable() and now - conn.idle_since < KEEPALIVE_S:
                return conn
            self._drop(conn)
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
        except TimeoutError:
            raise HttpConnectTimeout("no connection within the connect timeout") from None
        except (OSError, ssl.SSLError) as exc:
            raise HttpConnectError(f"connecting failed: {type(exc).__name__}") from None
        self._open.add(conn)
        return conn

    def _give_back(self, conn: _Connection, *, reusable: bool) -> None:
        """A request is over: its slot is free, its connection pooled or closed."""
        self._slots.release()
        if reusable and not self._closed and conn.reusable():
            conn.idle()
            self._idle.append(conn)
        else:
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        conn._stop_timer()
        if conn.transport is not None and not conn.transport.is_closing():
            conn.transport.close()
        self._open.discard(conn)

    def _forget(self, conn: _Connection) -> None:
        """A connection ended (`connection_lost`): an idle one leaves the pool."""
        self._open.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    async def aclose(self) -> None:
        """Close every connection; requests in flight fail as disconnected."""
        self._closed = True
        for conn in list(self._open):
            self._drop(conn)
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports' connection_lost run


_HEAD_END: Final = b"\r\n\r\n"


def _unsafe(text: str) -> bool:
    return "\r" in text or "\n" in text or "\0" in text


__all__ = ["H1_ENCODINGS", "KEEPALIVE_S", "H1Pool", "H1Response"]
