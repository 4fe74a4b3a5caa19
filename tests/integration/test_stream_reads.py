"""Reading a stream with message gets only (worker/bus/stream_reads.py), on a real NATS server.

What the gateway, `AipClient` and the escalation readers rely on since no role but admin
may create a consumer: every stored message once, in stream order; a new one delivered as
soon as it is stored (the shared wake-up subscription), long before the polling fallback;
one subscription per subject pattern however many follow it, gone when nobody does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import StreamConfig

from worker.bus.stream_reads import SubjectFollower, Wakeups, drain, next_stored, pattern_of
from worker.testing.services import ServiceHandle

STREAM = "STREAM_READS_TEST"
#: Long enough that only a wake-up can explain a prompt answer.
SLOW_POLL_S = 20.0


@pytest.fixture
async def nc(nats_server: ServiceHandle) -> AsyncIterator[NATS]:
    client = await nats.connect(nats_server.url)
    js = client.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=["reads.>"]))
    try:
        yield client
    finally:
        await js.delete_stream(STREAM)
        await client.close()


async def test_drain_reads_every_stored_message_of_a_subject_in_order(nc: NATS) -> None:
    js = nc.jetstream()
    for n in range(5):
        await js.publish(f"reads.a.{n % 2}", str(n).encode())
    assert [m.data for m in await drain(js, STREAM, "reads.a.0")] == [b"0", b"2", b"4"]
    assert [m.data for m in await drain(js, STREAM, "reads.a.*", start_seq=3)] == [
        b"2", b"3", b"4",
    ]  # fmt: skip
    assert [m.data for m in await drain(js, STREAM, "reads.a.*", limit=2)] == [b"0", b"1"]
    assert await next_stored(js, STREAM, "reads.none", 1) is None
    assert await next_stored(js, "NO_SUCH_STREAM", "reads.a.0", 1) is None


async def test_a_follower_is_woken_by_a_new_message_not_by_polling(nc: NATS) -> None:
    js = nc.jetstream()
    await js.publish("reads.b.x", b"first")
    async with SubjectFollower(nc, STREAM, "reads.b.x", poll_s=SLOW_POLL_S) as follower:
        first = await follower.next(0)
        assert first is not None
        assert first.data == b"first"
        assert await follower.next(0) is None  # drained: nothing more is stored
        waiting = asyncio.ensure_future(follower.next(SLOW_POLL_S * 2))
        await asyncio.sleep(0.2)
        await js.publish("reads.b.other", b"not mine")
        published = time.monotonic()
        await js.publish("reads.b.x", b"second")
        second = await waiting
        assert second is not None
        assert second.data == b"second"
        assert time.monotonic() - published < SLOW_POLL_S / 4
        started = time.monotonic()
        assert await follower.next(0.3) is None
        assert time.monotonic() - started >= 0.3


async def test_followers_share_one_subscription_per_pattern_while_they_wait(nc: NATS) -> None:
    subscriptions_before = len(nc._subs)
    wakeups = Wakeups.of(nc)
    assert Wakeups.of(nc) is wakeups
    assert pattern_of("reads.c.act_1") == "reads.c.*"
    async with (
        SubjectFollower(nc, STREAM, "reads.c.act_1") as one,
        SubjectFollower(nc, STREAM, "reads.c.act_2") as two,
    ):
        assert len(nc._subs) == subscriptions_before + 1
        await nc.jetstream().publish("reads.c.act_2", b"for two")
        found = await two.next(5.0)
        assert found is not None
        assert found.data == b"for two"
        assert await one.next(0) is None
    await asyncio.sleep(0.1)  # the unsubscribe is sent in the background
    assert len(nc._subs) == subscriptions_before
