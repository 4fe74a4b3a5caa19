"""The shared script connection (`worker.store.multiplexed`) against a real Redis: replies
reach the right caller, errors keep redis-py's classes, and a lost, hung or restarted
server fails calls the way the stores' re-ask expects, then the next call reconnects."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import AsyncIterator

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from schemas.ids import new_action_id
from worker.store.connection import is_transient, multiplexed, open_redis
from worker.store.health import is_refused
from worker.store.keys import ActionKeys
from worker.store.lease_store import AcquireStatus, LeaseStore, SettleStatus
from worker.store.multiplexed import Multiplexed, pack
from worker.testing.services import ServiceHandle, eventually

#: A script that keeps Redis busy for ARGV[1] microseconds (DEBUG SLEEP is off by default).
BUSY = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > tonumber(ARGV[1])
return 1
"""


@pytest.fixture
async def mux(redis_server: ServiceHandle) -> AsyncIterator[Multiplexed]:
    shared = Multiplexed.for_url(redis_server.url, timeout_s=1.0, connect_timeout_s=1.0)
    assert shared is not None
    yield shared
    await shared.aclose()


async def test_concurrent_callers_each_get_their_own_reply(mux: Multiplexed) -> None:
    keys = [f"mux:{new_action_id()}:{n}" for n in range(300)]
    await asyncio.gather(*(mux.execute("SET", key, key) for key in keys))
    replies = await asyncio.gather(*(mux.execute("GET", key) for key in keys))
    assert replies == [key.encode() for key in keys]


async def test_error_replies_raise_redis_pys_classes_and_the_connection_stays_usable(
    mux: Multiplexed,
) -> None:
    with pytest.raises(NoScriptError):
        await mux.execute("EVALSHA", "0" * 40, 0)
    with pytest.raises(ResponseError, match="unknown command"):
        await mux.execute("NO-SUCH-COMMAND")
    assert await mux.execute("PING") == b"PONG"


async def test_a_cancelled_caller_leaves_the_next_reply_to_the_next_caller(
    mux: Multiplexed,
) -> None:
    key = f"mux:{new_action_id()}"
    await mux.execute("SET", key, "value")
    slow = asyncio.ensure_future(mux.execute("EVAL", BUSY, 0, 200_000))
    await asyncio.sleep(0.05)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    # The abandoned reply arrives first and is dropped; this caller gets its own.
    assert await mux.execute("GET", key) == b"value"


async def test_many_commands_answer_in_order_and_the_first_error_is_raised_after_all(
    mux: Multiplexed,
) -> None:
    key = f"mux:{new_action_id()}"
    replies = await mux.execute_many([("SET", key, "1"), ("INCR", key), ("GET", key)])
    assert replies == [b"OK", 2, b"2"]
    with pytest.raises(ResponseError, match="not an integer"):
        await mux.execute_many(
            [("SET", key, "text"), ("INCR", key), ("NO-SUCH-COMMAND",), ("SET", key, "after")]
        )
    # Every command was written and answered: the one after both errors ran too, and the
    # connection hands the next caller its own reply.
    assert await mux.execute("GET", key) == b"after"
    assert await mux.execute_many([]) == []


async def test_a_cancelled_batch_leaves_the_next_reply_to_the_next_caller(
    mux: Multiplexed, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat's renewal is cancelled when the worker stops: the batch's replies
    still to come are dropped unread, and an error among them is not reported as an
    exception nobody retrieved."""
    key = f"mux:{new_action_id()}"
    await mux.execute("SET", key, "value")
    batch = asyncio.ensure_future(
        mux.execute_many(
            [("EVAL", BUSY, 0, 200_000), ("NO-SUCH-COMMAND",), ("EVAL", BUSY, 0, 1_000)]
        )
    )
    await asyncio.sleep(0.05)
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await batch
    assert await mux.execute("GET", key) == b"value"
    assert await mux.execute_many([("GET", key), ("PING",)]) == [b"value", b"PONG"]
    del batch
    gc.collect()
    await asyncio.sleep(0)
    assert "exception was never retrieved" not in caplog.text


async def test_url_options_are_honoured_and_tls_or_sockets_keep_redis_py() -> None:
    assert Multiplexed.for_url("rediss://127.0.0.1:6379/0") is None
    assert Multiplexed.for_url("unix:///tmp/redis.sock") is None
    shared = Multiplexed.for_url("redis://user:pw@127.0.0.1:6390/3", password="other")
    assert shared is not None
    assert (shared.port, shared.db, shared.username, shared.password) == (6390, 3, "user", "other")


async def test_only_a_single_server_client_from_open_redis_multiplexes(
    redis_server: ServiceHandle,
) -> None:
    client = open_redis(redis_server.url)
    try:
        assert multiplexed(client) is not None
        store = LeaseStore(client)
        assert store.scripts.cancel_safe
        keys = ActionKeys.of(new_action_id())
        grant = await store.acquire(keys, "w1#a", 5_000, "fp")
        assert (grant.status, grant.fence) == (AcquireStatus.ACQUIRED, 1)
        settled = await store.settle(keys, "w1#a", grant.fence, b'{"ok":true}', b'{}')
        assert (settled.status, settled.stored) == (SettleStatus.SETTLED, b'{"ok":true}')
    finally:
        await client.aclose()
    assert multiplexed(open_redis(redis_server.url.rsplit("/", 1)[0], cluster=True)) is None


@pytest.mark.chaos
async def test_a_killed_server_fails_waiting_calls_and_a_restart_is_reconnected(
    redis_server: ServiceHandle,
) -> None:
    shared = Multiplexed.for_url(redis_server.url, timeout_s=2.0, connect_timeout_s=1.0)
    assert shared is not None
    try:
        assert await shared.execute("PING") == b"PONG"
        waiting = asyncio.ensure_future(
            shared.execute("EVAL", BUSY, 0, 1_000_000)
        )
        await asyncio.sleep(0.1)
        redis_server.kill()
        with pytest.raises(RedisConnectionError) as lost:
            await waiting
        assert is_transient(lost.value)
        with pytest.raises(RedisConnectionError) as refused:
            await shared.execute("PING")
        assert is_transient(refused.value)
        assert is_refused(refused.value)
        redis_server.start()
        assert await shared.execute("PING") == b"PONG"
    finally:
        await shared.aclose()


@pytest.mark.chaos
async def test_a_hung_server_times_out_and_the_connection_is_replaced(
    redis_server: ServiceHandle,
) -> None:
    shared = Multiplexed.for_url(redis_server.url, timeout_s=0.5, connect_timeout_s=0.5)
    assert shared is not None
    try:
        assert await shared.execute("PING") == b"PONG"
        redis_server.pause()
        try:
            with pytest.raises(RedisTimeoutError) as hung:
                await shared.execute("PING")
            assert is_transient(hung.value)
        finally:
            redis_server.resume()
        assert await shared.execute("PING") == b"PONG"
    finally:
        await shared.aclose()


async def test_the_shared_connection_has_tcp_keepalive_and_pings_when_idle(
    redis_server: ServiceHandle,
) -> None:
    shared = Multiplexed.for_url(redis_server.url, timeout_s=1.0, health_interval_s=0.2)
    assert shared is not None
    try:
        assert await shared.execute("PING") == b"PONG"
        wire = shared._wire  # the connection itself: what its socket was given
        assert wire is not None
        sock = wire.transport.get_extra_info("socket") if wire.transport else None
        assert sock is not None
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        await asyncio.sleep(0.7)  # idle: no caller sends anything
        assert wire.pings >= 2
        assert not wire.closed
        assert shared.connects == 1
        # A connection kept busy by callers is not pinged on top of them.
        busy_pings = wire.pings
        for _ in range(8):
            await shared.execute("PING")
            await asyncio.sleep(0.05)
        assert wire.pings <= busy_pings + 1
    finally:
        await shared.aclose()


@pytest.mark.chaos
async def test_an_idle_connection_to_a_hung_server_is_found_by_its_ping_and_replaced(
    redis_server: ServiceHandle,
) -> None:
    """No caller is waiting when the server hangs: the idle connection's own PING goes
    unanswered, the connection is failed and replaced in the background, and after the
    server resumes the next call answers at once on a fresh connection."""
    shared = Multiplexed.for_url(
        redis_server.url, timeout_s=0.3, connect_timeout_s=0.5, health_interval_s=0.2
    )
    assert shared is not None
    try:
        assert await shared.execute("PING") == b"PONG"
        first = shared._wire
        assert first is not None
        await asyncio.to_thread(redis_server.pause)
        try:
            await asyncio.sleep(1.0)  # one interval, one unanswered PING, and a margin
        finally:
            await asyncio.to_thread(redis_server.resume)
        assert first.closed
        assert shared.connects >= 2

        # The replacement itself connected while the server hung (the kernel accepts), so
        # its own health PING may still be out at the resume, and be failed by its timeout
        # just after it: a call queued behind it then fails as transient (a CI run saw it).
        # Once no PING is outstanding, the connection in place answers at once.
        def settled() -> bool:
            wire = shared._wire
            return wire is not None and not wire.closed and not wire.waiting

        await eventually(settled, within=5, what="a connection with no PING outstanding")
        async with asyncio.timeout(0.5):
            assert await shared.execute("PING") == b"PONG"
        assert shared._wire is not first
    finally:
        await shared.aclose()


async def test_a_closed_client_replaces_nothing(redis_server: ServiceHandle) -> None:
    shared = Multiplexed.for_url(redis_server.url, timeout_s=1.0, health_interval_s=0.2)
    assert shared is not None
    assert await shared.execute("PING") == b"PONG"
    await shared.aclose()
    await asyncio.sleep(0.5)
    assert shared.connects == 1
    assert shared._wire is None


async def test_a_call_on_a_connection_that_failed_after_it_was_handed_out_fails_at_once(
    redis_server: ServiceHandle,
) -> None:
    """docs/reliability.md, bug 5: a caller that got the connection just before it failed
    (a reset right after the connect) sent on it anyway; the call was never written nor
    answered, and waited forever, holding its Action's settle, while the lease heartbeat
    renewed on the next connection. It now fails at once, as a transient error."""
    shared = Multiplexed.for_url(redis_server.url, timeout_s=0.5, connect_timeout_s=1.0)
    assert shared is not None
    try:
        assert await shared.execute("PING") == b"PONG"
        wire = shared._wire
        assert wire is not None
        wire.fail(RedisConnectionError("Connection reset by peer"))
        with pytest.raises(RedisConnectionError) as failed:
            await asyncio.wait_for(wire.send(pack(("PING",))), 5)
        assert is_transient(failed.value)
        assert await shared.execute("PING") == b"PONG"
    finally:
        await shared.aclose()
