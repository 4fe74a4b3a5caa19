"""The worker's own HTTP/1.1 pool (`worker.hermes.h1`) against raw TCP servers that answer
byte for byte what each case needs: reuse and its limits, what counts as "never sent", the
read timeout, flow control, and answers that are not HTTP."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from worker.errors import (
    HttpConnectError,
    HttpConnectTimeout,
    HttpDisconnected,
    HttpHeaderRefused,
    HttpPoolTimeout,
    HttpProtocolError,
    HttpReadTimeout,
)
from worker.hermes import h1
from worker.hermes.h1 import H1Pool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A TCP server running `handler` per connection; counts connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length) if length else b""
        self.requests.append(head + body)
        return head + body

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


#: Makes a pool for a URL (`max_connections`, the timeouts: keyword overrides), closed
#: when the test ends.
PoolFor = Callable[..., H1Pool]


@pytest_asyncio.fixture
async def pool_for() -> AsyncIterator[PoolFor]:
    pools: list[H1Pool] = []

    def make(
        url: str,
        *,
        max_connections: int = 8,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 5.0,
        pool_timeout_s: float = 2.0,
    ) -> H1Pool:
        pool = H1Pool(
            url,
            max_connections=max_connections,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            pool_timeout_s=pool_timeout_s,
        )
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        await pool.aclose()


def answer(body: bytes, *headers: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


async def test_a_whole_answer_frees_its_connection_for_the_next_request(
    pool_for: PoolFor,
) -> None:
    async def two(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):
            await server.read_request(reader)
            writer.write(answer(b'{"ok": true}', b"Content-Type: application/json"))

    async with RawServer(two) as server:
        pool = pool_for(server.url + "/prefix/")
        for _ in range(2):
            response = await pool.open("POST", "/v1/runs", [("x-a", "1")], b"{}")
            assert (response.status, response.headers["content-type"]) == (200, "application/json")
            assert await response.read(1024) == b'{"ok": true}'
            response.release()
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /prefix/v1/runs HTTP/1.1\r\n")
    assert b"\r\nx-a: 1\r\n" in first
    assert b"\r\nContent-Length: 2\r\n" in first
    assert b"\r\nHost: 127.0.0.1:" in first
    assert first.endswith(b"\r\n\r\n{}")


async def test_an_idle_connection_past_keep_alive_is_closed_not_reused(
    pool_for: PoolFor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start must never go to a connection the server may be closing: only young idle
    connections are reused."""
    monkeypatch.setattr(h1, "KEEPALIVE_S", 0.2)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.read_request(reader)
            writer.write(answer(b"{}"))

    async with RawServer(serve) as server:
        pool = pool_for(server.url)
        for pause in (0.0, 0.4):
            await asyncio.sleep(pause)
            response = await pool.open("GET", "/x", [], None)
            await response.read(10)
            response.release()
    assert server.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_not_reused(
    pool_for: PoolFor,
) -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(answer(b"{}"))
        await writer.drain()  # then the handler returns and the server closes it

    async with RawServer(once) as server:
        pool = pool_for(server.url)
        for _ in range(2):
            response = await pool.open("GET", "/x", [], None)
            assert await response.read(10) == b"{}"
            response.release()
            await asyncio.sleep(0.1)  # the server's close arrives
    assert server.connections == 2


async def test_no_connection_is_never_sent(pool_for: PoolFor) -> None:
    pool = pool_for("http://127.0.0.1:9")
    with pytest.raises(HttpConnectError):
        await pool.open("POST", "/v1/runs", [], b"{}")


async def test_a_connect_that_hangs_is_a_connect_timeout(pool_for: PoolFor) -> None:
    """An address that never answers a SYN (TEST-NET-1): nothing was written."""
    pool = pool_for("http://192.0.2.1:80", connect_timeout_s=0.2)
    with pytest.raises((HttpConnectTimeout, HttpConnectError)):
        await pool.open("POST", "/v1/runs", [], b"{}")


async def test_every_slot_taken_past_the_pool_timeout_is_never_sent(
    pool_for: PoolFor,
) -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await asyncio.sleep(5)

    async with RawServer(hold) as server:
        pool = pool_for(server.url, max_connections=1, pool_timeout_s=0.2)
        held = await pool.open("GET", "/stream", [], None)
        with pytest.raises(HttpPoolTimeout):
            await pool.open("POST", "/v1/runs", [], b"{}")
        assert len(server.requests) == 1  # the second request never reached the server
        held.release()  # not read to its end: its connection is closed
        await asyncio.sleep(0.05)
    assert server.connections == 1


@pytest.mark.parametrize(
    "header", [("x-a", "1\r\nX-Injected: yes"), ("x-a", "a\nb"), ("x-a\r\nb", "1"), ("x:a", "1")]
)
async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(
    pool_for: PoolFor, header: tuple[str, str]
) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)

    async with RawServer(serve) as server:
        pool = pool_for(server.url)
        with pytest.raises(HttpHeaderRefused):
            await pool.open("GET", "/x", [header], None)
        await asyncio.sleep(0.05)
    assert server.connections == 0


async def test_a_close_before_the_answer_may_have_run(pool_for: PoolFor) -> None:
    async def read_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)

    async with RawServer(read_then_close) as server:
        pool = pool_for(server.url)
        with pytest.raises(HttpDisconnected):
            await pool.open("POST", "/v1/runs", [], b"{}")
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("reply", "body"),
    [
        # A length promised and not kept: the answer broke off (the request may have run).
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", None),
        # No length and not chunked: the body ends with the connection.
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it", b"all of it"),
    ],
)
async def test_a_close_inside_a_body_ends_it_only_when_nothing_else_delimits_it(
    pool_for: PoolFor, reply: bytes, body: bytes | None
) -> None:
    async def close_after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(reply)
        await writer.drain()

    async with RawServer(close_after) as server:
        pool = pool_for(server.url)
        response = await pool.open("GET", "/x", [], None)
        if body is None:
            with pytest.raises(HttpDisconnected):
                await response.read(100)
        else:
            assert await response.read(100) == body
        response.release()


async def test_no_byte_within_the_read_timeout_fails_the_wait(pool_for: PoolFor) -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        if len(server.requests) == 2:  # the second request: head, then nothing more
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        await asyncio.sleep(3)

    async with RawServer(stall) as server:
        pool = pool_for(server.url, read_timeout_s=0.3)
        with pytest.raises(HttpReadTimeout):  # no head at all
            await pool.open("POST", "/v1/runs", [], b"{}")
        response = await pool.open("GET", "/events", [], None)
        pieces = response.iter_chunked()
        assert await anext(pieces) == b"a"
        with pytest.raises(HttpReadTimeout):  # then silence inside the body
            await anext(pieces)
        response.release()


async def test_a_stream_read_slowly_pauses_the_socket_and_loses_nothing(
    pool_for: PoolFor,
) -> None:
    piece = bytes(range(256)) * 256  # 64 KiB
    count = 40  # 2.5 MiB, well past the high-water mark

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(count):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with RawServer(flood) as server:
        pool = pool_for(server.url)
        response = await pool.open("GET", "/events", [], None)
        await asyncio.sleep(0.3)  # let the server fill what the client buffers
        conn = response._conn
        assert conn.paused
        buffered = response._size
        assert h1.HIGH_WATER < buffered < h1.HIGH_WATER + 4 * len(piece) + 65_536 * 4
        received = bytearray()
        async for chunk in response.iter_chunked():
            received += chunk
        assert received == piece * count
        response.release()


async def test_an_answer_not_read_to_its_end_closes_the_connection(
    pool_for: PoolFor,
) -> None:
    """How Hermes learns the client left an event stream."""

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        assert await reader.read() == b""  # EOF: the client went away
        server.closed_by_client.set()

    async with RawServer(stream) as server:
        pool = pool_for(server.url)
        response = await pool.open("GET", "/events", [], None)
        assert await anext(response.iter_chunked()) == b"abc"
        response.release()
        await asyncio.wait_for(server.closed_by_client.wait(), 2)


async def test_a_gzip_body_is_decoded(pool_for: PoolFor) -> None:
    async def zipped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(answer(gzip.compress(b'{"run_id": "r"}'), b"Content-Encoding: gzip"))

    async with RawServer(zipped) as server:
        pool = pool_for(server.url)
        response = await pool.open("POST", "/v1/runs", [], b"{}")
        assert await response.read(100) == b'{"run_id": "r"}'
        response.release()


@pytest.mark.parametrize(
    "reply",
    [b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"],
)
async def test_an_answer_that_is_not_http_is_a_protocol_error(
    pool_for: PoolFor, reply: bytes
) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(reply)
        await asyncio.sleep(1)

    async with RawServer(garbage) as server:
        pool = pool_for(server.url)
        with pytest.raises(HttpProtocolError):
            await pool.open("POST", "/v1/runs", [], b"{}")


async def test_a_cancelled_request_drops_its_connection_and_frees_its_slot(
    pool_for: PoolFor,
) -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        if len(server.requests) == 1:
            await asyncio.sleep(3)
        else:
            writer.write(answer(b"{}"))
            await asyncio.sleep(1)

    async with RawServer(slow) as server:
        pool = pool_for(server.url, max_connections=1, pool_timeout_s=0.5)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.open("POST", "/v1/runs", [], b"{}")
        response = await pool.open("GET", "/x", [], None)  # the slot is free again
        assert await response.read(10) == b"{}"
        response.release()
    assert server.connections == 2
