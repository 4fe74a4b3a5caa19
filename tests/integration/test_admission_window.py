"""The pull loop's admission window, over a real JetStream consumer.

Slots bound how many Actions a worker runs; the window bounds how many it has fetched that
no lease heartbeat keeps alive yet (their AckWait runs). A delivery's place is freed where
the lease keeper takes it over (`LeaseKeeper.add` calls `admitted`) or when its handling
ends. Without the window a saturated worker with 10,000 slots fetched as fast as it could
while its AckWait clocks ran (BENCHMARKS.md, "An admission window").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from worker.bus.consumer import SLOW_FETCH_S, PullLoop, Slots, admitted
from worker.execution.leases import LeaseKeeper
from worker.testing.services import ServiceHandle, eventually

STREAM, DURABLE, SUBJECT = "WINDOW", "window_work", "window.work"
OFFERED = 40
LIMIT = 5

pytestmark = pytest.mark.timeout(60)


async def _offer(js: Any) -> None:
    await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT]))
    await js.add_consumer(
        STREAM,
        ConsumerConfig(durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT, ack_wait=30),
    )
    for n in range(OFFERED):
        await js.publish(SUBJECT, b"%d" % n)


@asynccontextmanager
async def _acks_seen(url: str) -> AsyncIterator[list[bytes]]:
    """What the consumer's ack subjects carry (acks, naks, in-progress signals), as a plain
    subscriber on the wire sees it, in order."""
    spy = await nats.connect(url)
    seen: list[bytes] = []

    async def on_ack(msg: Any) -> None:
        seen.append(msg.data)

    try:
        await spy.subscribe(f"$JS.ACK.{STREAM}.{DURABLE}.>", cb=on_ack)
        await spy.flush()
        yield seen
    finally:
        await spy.close()


async def _acks_after(
    url: str, handle: Any, release: asyncio.Event, handled: list[Any], expected: int
) -> list[bytes]:
    """What the consumer's ack subjects carried once `handle` has seen every offered message
    (it appends each to `handled`) and `expected` signals arrived, plus 0.3 s for any more."""
    async with _acks_seen(url) as seen, _pulling(url, handle, limit=OFFERED, release=release):
        await eventually(lambda: len(handled) == OFFERED, within=10, what="every delivery")
        await eventually(lambda: len(seen) >= expected, within=10, what="the ack signals")
        await asyncio.sleep(0.3)
        return list(seen)


@dataclass
class _Pulling:
    """A pull loop over the offered messages, and what a test looks at."""

    js: Any
    slots: Slots
    window: Slots


@asynccontextmanager
async def _pulling(
    url: str, handle: Any, *, limit: int, release: asyncio.Event
) -> AsyncIterator[_Pulling]:
    """Offer `OFFERED` messages and run a `PullLoop` with 1,000 slots and a window of
    `limit` over them until the test is done; `release` is set before the loop stops, so
    handlers waiting on it end."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await _offer(js)
    pulling = _Pulling(js, Slots(1_000), Slots(limit))
    loop = PullLoop(
        js, stream=STREAM, durable=DURABLE, subject=SUBJECT, slots=pulling.slots,
        handle=handle, fetch_timeout_s=0.2, window=pulling.window,
    )
    task = asyncio.get_running_loop().create_task(loop.run())
    try:
        yield pulling
    finally:
        loop.stop()
        release.set()
        task.cancel()
        await asyncio.gather(task, *loop.tasks, return_exceptions=True)
        await nc.close()


async def test_no_more_deliveries_await_admission_than_the_window_holds(
    nats_server: ServiceHandle,
) -> None:
    handed: list[Any] = []
    admit, release = asyncio.Event(), asyncio.Event()

    async def handle(msg: Any) -> None:
        handed.append(msg)
        await admit.wait()
        admitted()  # what the lease keeper says once the heartbeat covers the delivery
        await release.wait()
        await msg.ack()

    async with _pulling(nats_server.url, handle, limit=LIMIT, release=release) as pulling:
        await eventually(
            lambda: len(handed) == LIMIT,
            within=10, what="the window's worth of deliveries",
        )
        await asyncio.sleep(0.6)  # three more fetch timeouts: nothing else may come
        assert len(handed) == LIMIT, "slots were free, but the window was full"
        assert pulling.window.in_use == LIMIT
        info = await pulling.js.consumer_info(STREAM, DURABLE)
        assert info.num_pending == OFFERED - LIMIT  # the rest waits on the stream, unsent
        admit.set()  # each delivery is kept alive by its lease now: its place is free
        await eventually(
            lambda: len(handed) == OFFERED,
            within=10, what="every delivery handed out",
        )
        await eventually(
            lambda: pulling.window.in_use == 0,
            within=10, what="every window place given back",
        )
        assert pulling.slots.in_use == OFFERED  # still running: slots and window count apart


async def test_a_delivery_that_ends_before_its_lease_gives_its_place_back(
    nats_server: ServiceHandle,
) -> None:
    done: list[Any] = []

    async def handle(msg: Any) -> None:  # a refusal or a duplicate: no lease, no admitted()
        await msg.ack()
        done.append(msg)

    async with _pulling(
        nats_server.url, handle, limit=LIMIT, release=asyncio.Event()
    ) as pulling:
        await eventually(lambda: len(done) == OFFERED, within=10, what="every delivery done")
        await eventually(
            lambda: pulling.window.in_use == 0 and pulling.slots.in_use == 0,
            within=10, what="every place and slot given back",
        )


async def test_the_lease_keeper_taking_an_execution_frees_its_delivery_place(
    nats_server: ServiceHandle,
) -> None:
    keeper: LeaseKeeper[Any] = LeaseKeeper(None, None, lease_ttl_ms=15_000)  # type: ignore[arg-type]
    release = asyncio.Event()

    async def handle(msg: Any) -> None:
        n = msg.data.decode()
        lease, action = SimpleNamespace(owner=f"o{n}"), SimpleNamespace(id=f"act_{n}")
        keeper.add(SimpleNamespace(lease=lease, action=action))
        await release.wait()
        await msg.ack()

    async with _pulling(nats_server.url, handle, limit=LIMIT, release=release) as pulling:
        await eventually(
            lambda: len(keeper.executions) == OFFERED,
            within=10, what="every execution kept",
        )
        assert pulling.window.in_use == 0


def test_places_freed_twice_are_counted_once() -> None:
    """`admitted` and the end of the delivery both give the place back: only once counts."""
    window = Slots(2)
    window.take(2)

    async def one() -> None:
        from worker.bus import consumer

        place = consumer._Place(window, None, time.monotonic())  # type: ignore[arg-type]
        consumer._place.set(place)
        admitted()
        admitted()
        place.give_back()

    asyncio.run(one())
    assert window.in_use == 1


@pytest.mark.parametrize(("slow_after_s", "signals"), [(0.0, OFFERED), (60.0, 0)])
async def test_deliveries_that_waited_in_a_slow_fetch_get_their_ackwait_restarted(
    nats_server: ServiceHandle, monkeypatch: pytest.MonkeyPatch, slow_after_s: float, signals: int
) -> None:
    """nats-py reads a batch one message per event-loop pass: on a saturated worker a fetch
    returns seconds after the server delivered its first messages. A fetch slower than
    `SLOW_FETCH_S` sends each of its messages an in-progress signal at once (seen here on
    the wire, by a plain subscriber to the consumer's ack subjects); a quick one sends none."""
    from worker.bus import consumer

    monkeypatch.setattr(consumer, "SLOW_FETCH_S", slow_after_s)
    handed: list[Any] = []
    release = asyncio.Event()

    async def handle(msg: Any) -> None:
        handed.append(msg)
        await release.wait()

    seen = await _acks_after(nats_server.url, handle, release, handed, signals)
    assert seen.count(b"+WPI") == signals
    assert len(seen) == signals  # nothing acked, nothing nak'd


@pytest.mark.parametrize(("admission_s", "signals"), [(SLOW_FETCH_S + 0.3, OFFERED), (0.0, 0)])
async def test_deliveries_admitted_slowly_get_their_ackwait_restarted_at_admission(
    nats_server: ServiceHandle, admission_s: float, signals: int
) -> None:
    """On a swamped loop the way from a fetch to the lease can take seconds, all counted
    against the AckWait, and the heartbeat's first signal may be a whole interval later.
    A delivery that took longer than `SLOW_FETCH_S` to be admitted sends one in-progress
    signal when it is (seen on the wire); one admitted at once sends none."""
    admitted_ids: list[Any] = []
    release = asyncio.Event()

    async def handle(msg: Any) -> None:
        await asyncio.sleep(admission_s)  # decode, trust, lease: slow on a swamped loop
        admitted()
        admitted_ids.append(msg)
        await release.wait()

    seen = await _acks_after(nats_server.url, handle, release, admitted_ids, signals)
    assert seen.count(b"+WPI") == signals
    assert len(seen) == signals  # nothing acked, nothing nak'd
