"""The fault proxy does to bytes what the nemesis says: a cut holds them (and releases
them in order on the heal), latency delays them, a drop resets the connections."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.chaos.proxy import FaultProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    proxy = await FaultProxy("test", server.sockets[0].getsockname()[1]).start()
    try:
        yield proxy
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


async def _connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def test_bytes_pass_through(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    writer.write(b"ping")
    assert await asyncio.wait_for(reader.readexactly(4), 2) == b"ping"
    writer.close()


@pytest.mark.parametrize("direction", ["up", "down", "both"])
async def test_a_cut_holds_bytes_until_the_heal(proxy: FaultProxy, direction: str) -> None:
    reader, writer = await _connect(proxy)
    writer.write(b"a")
    assert await asyncio.wait_for(reader.readexactly(1), 2) == b"a"
    proxy.set(cut_up=direction in ("up", "both"), cut_down=direction in ("down", "both"))
    writer.write(b"held")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(4), 0.5)
    proxy.heal()
    assert await asyncio.wait_for(reader.readexactly(4), 2) == b"held"
    writer.close()


async def test_a_new_connection_during_an_upward_cut_hangs(proxy: FaultProxy) -> None:
    proxy.set(cut_up=True)
    reader, writer = await _connect(proxy)  # the proxy accepts; the SYN "is lost" behind it
    writer.write(b"x")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(1), 0.5)
    proxy.heal()
    assert await asyncio.wait_for(reader.readexactly(1), 2) == b"x"
    writer.close()


async def test_latency_delays_each_direction(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    proxy.set(latency_s=0.2)
    started = time.monotonic()
    writer.write(b"slow")
    assert await asyncio.wait_for(reader.readexactly(4), 3) == b"slow"
    assert time.monotonic() - started >= 0.4  # once up, once down
    writer.close()


async def test_a_drop_resets_open_connections_and_refuses_new_ones(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    writer.write(b"a")
    await asyncio.wait_for(reader.readexactly(1), 2)
    assert proxy.drop(refuse_s=0.5) == 2  # both ends of the one connection
    assert await asyncio.wait_for(reader.read(), 2) == b""
    writer.close()
    reader2, writer2 = await _connect(proxy)
    assert await asyncio.wait_for(reader2.read(), 2) == b""
    writer2.close()
    await asyncio.sleep(0.6)
    reader3, writer3 = await _connect(proxy)
    writer3.write(b"ok")
    assert await asyncio.wait_for(reader3.readexactly(2), 2) == b"ok"
    writer3.close()
