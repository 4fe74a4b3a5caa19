"""An overloaded worker keeps the leases it holds before it takes more work.

On a swamped event loop the heartbeat's renewal round trip grew to 3-21 s against a 5 s
interval, and thousands of leases ran past the 0.8 of the TTL they are trusted for while
their runs were fine (BENCHMARKS.md, "An overloaded worker keeps its leases"). Ticks now
start one interval apart however long each took, and a renewal round trip longer than half
the interval closes the fetch gate (`HeartbeatPressure`) until one takes less than a
quarter. Here the round trip is made slow the way a real one is: Redis does not answer
(SIGSTOP) for longer than the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from tests.integration.held_leases import held_lease
from worker.bus.consumer import AllGates, PullLoop, Slots, admitted
from worker.execution.heartbeat_pressure import HeartbeatPressure
from worker.execution.leases import LeaseKeeper
from worker.logs import RepeatedErrors
from worker.store.connection import open_redis
from worker.store.health import StoreHealth
from worker.store.lease_store import LeaseStore
from worker.testing.services import ServiceHandle, eventually

#: A 3 s TTL: ticks 1 s apart, a round trip over 0.5 s closes the gate, one under 0.25 s
#: opens it.
TTL_MS = 3_000

pytestmark = pytest.mark.timeout(60)


@pytest.mark.chaos
async def test_a_slow_renewal_closes_the_fetch_gate_until_a_quick_one(
    redis_server: ServiceHandle,
) -> None:
    client = open_redis(redis_server.url, socket_timeout_s=5.0)
    try:
        store = LeaseStore(client, call_budget_s=2.0)
        keeper: LeaseKeeper[Any] = LeaseKeeper(store, None, lease_ttl_ms=TTL_MS)  # type: ignore[arg-type]
        lease, _ = await held_lease(store, keeper, TTL_MS)
        await keeper.tick()
        assert keeper.pressure.accepting  # a quick round trip

        redis_server.pause()
        asyncio.get_running_loop().call_later(0.9, redis_server.resume)
        sent_at = time.monotonic()
        tick = asyncio.get_running_loop().create_task(keeper.tick())
        await asyncio.sleep(0.7)
        assert not tick.done()
        assert not keeper.pressure.accepting, "closed while the round trip is under way"
        await tick
        assert not keeper.pressure.accepting
        assert keeper.pressure.strained_s >= 0.85
        assert lease.lost is None  # slow, but renewed
        assert lease.renewed_at >= sent_at

        await keeper.tick()
        assert keeper.pressure.accepting, "a quick round trip opens the gate again"
    finally:
        await client.aclose()


async def test_a_gate_closed_for_pressure_opens_when_no_lease_is_left() -> None:
    """A worker that finished everything it held has nothing to renew: it may fetch."""
    keeper: LeaseKeeper[Any] = LeaseKeeper(None, None, lease_ttl_ms=TTL_MS)  # type: ignore[arg-type]
    keeper.pressure.measured(2.0)
    assert not keeper.pressure.accepting
    keeper.pressure.measured(0.4)  # under the limit, not under the relief bound: still closed
    assert not keeper.pressure.accepting
    await keeper.tick()
    assert keeper.pressure.accepting


async def test_ticks_start_one_interval_apart_however_long_each_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tick taking most of the interval must not push the next one a whole interval
    further: the gap between two confirmations would grow by every round trip."""
    keeper: LeaseKeeper[Any] = LeaseKeeper(None, None, lease_ttl_ms=1_500)  # type: ignore[arg-type]
    starts: list[float] = []

    async def slow_tick() -> None:
        starts.append(time.monotonic())
        await asyncio.sleep(0.4)  # of an interval of 0.5 s

    monkeypatch.setattr(keeper, "tick", slow_tick)
    monkeypatch.setattr(keeper.notices, "run", asyncio.Event().wait)
    heartbeat = asyncio.get_running_loop().create_task(keeper.run())
    try:
        await eventually(lambda: len(starts) >= 5, within=10, what="five ticks")
    finally:
        heartbeat.cancel()
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    # Sleeping an interval after each tick would make every gap 0.9 s.
    assert sum(gaps) / len(gaps) < 0.7, gaps


async def test_all_gates_open_only_while_each_is() -> None:
    first, second = HeartbeatPressure(1.0), HeartbeatPressure(1.0)
    gates = AllGates(first, second)
    first.measured(0.9)
    second.measured(0.9)
    assert not gates.accepting
    waiting = asyncio.get_running_loop().create_task(gates.wait_accepting())
    await asyncio.sleep(0.05)
    first.relieved()
    await asyncio.sleep(0.05)
    assert not waiting.done()
    assert not gates.accepting
    second.relieved()
    async with asyncio.timeout(5):
        await waiting
    assert gates.accepting


@contextlib.asynccontextmanager
async def _gated_pull(
    url: str, name: str, pressure: HeartbeatPressure,
    handle: Callable[[Any], Awaitable[None]], *, window: Slots | None = None,
) -> AsyncIterator[Callable[[], Awaitable[int]]]:
    """Five messages on a fresh JetStream stream `name`, and a `PullLoop` behind
    `AllGates(pressure)` (as the worker wires it) handing them to `handle`; yields what
    tells how many are still pending on the stream, and stops the loop afterwards."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        subject, durable = f"{name.lower()}.work", f"{name.lower()}_work"
        await js.add_stream(StreamConfig(name=name, subjects=[subject]))
        await js.add_consumer(name, ConsumerConfig(
            durable_name=durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
        ))  # fmt: skip
        for n in range(5):
            await js.publish(subject, b"%d" % n)

        async def pending() -> int:
            return int((await js.consumer_info(name, durable)).num_pending)

        pull = PullLoop(
            js, stream=name, durable=durable, subject=subject, slots=Slots(100),
            handle=handle, fetch_timeout_s=0.2, gate=AllGates(pressure), window=window,
        )  # fmt: skip
        task = asyncio.get_running_loop().create_task(pull.run())
        try:
            yield pending
        finally:
            pull.stop()
            task.cancel()
            await asyncio.gather(task, *pull.tasks, return_exceptions=True)
    finally:
        await nc.close()


async def test_a_pull_loop_fetches_nothing_while_the_heartbeat_is_behind(
    nats_server: ServiceHandle,
) -> None:
    """The gate as the worker wires it (`AllGates` in front of a `PullLoop`), over a real
    JetStream consumer: while the heartbeat is behind, what is offered stays on the stream;
    once it keeps up, every message is handed out."""
    pressure = HeartbeatPressure(1.0)
    pressure.measured(0.9)  # over half the interval: behind
    handed: list[Any] = []

    async def handle(msg: Any) -> None:
        handed.append(msg)
        await msg.ack()

    async with _gated_pull(nats_server.url, "PRESSURE", pressure, handle) as pending:
        await asyncio.sleep(0.6)  # three fetch timeouts' worth: none may be asked for
        assert handed == []
        assert await pending() == 5
        pressure.measured(0.1)  # under a quarter of the interval: keeps up again
        await eventually(lambda: len(handed) == 5, within=10, what="every message")


async def test_a_pull_loop_waiting_for_window_room_does_not_fetch_once_the_gate_closed(
    nats_server: ServiceHandle,
) -> None:
    """The admission window fills exactly when the worker is swamped, which is when the
    heartbeat gate closes: a loop that was waiting for window room when the gate closed
    must not fetch when the room comes, or every such loop takes one more batch of the
    work the gate is there to leave on the bus."""
    pressure = HeartbeatPressure(1.0)
    release_first = asyncio.Event()
    handed: list[Any] = []

    async def handle(msg: Any) -> None:
        handed.append(msg)
        if len(handed) == 1:
            await release_first.wait()  # the window's one place stays taken until then
        admitted()
        await msg.ack()

    async with _gated_pull(
        nats_server.url, "ROOM", pressure, handle, window=Slots(1)
    ) as pending:
        await eventually(lambda: len(handed) == 1, within=10, what="the first message")
        await asyncio.sleep(0.3)  # the loop is now waiting for window room
        pressure.measured(0.9)  # the heartbeat falls behind: the gate closes
        release_first.set()  # and the room comes
        await asyncio.sleep(0.6)
        assert len(handed) == 1, "fetched after the gate closed"
        assert await pending() == 4
        pressure.measured(0.1)
        await eventually(lambda: len(handed) == 5, within=10, what="every message")


@pytest.mark.chaos
async def test_a_renewal_redis_refuses_fails_the_tick_not_the_heartbeat(
    redis_server: ServiceHandle,
) -> None:
    """A refusal `reask` does not ask again (here a lease key of the wrong type; an ACL or
    password changed under the worker is another) fails one tick: the heartbeat reports it,
    marks the store failing, goes on ticking, and reopens a gate it had closed once nothing
    is held. (It used to end the heartbeat: no renewal again, and the gate closed for good.)"""
    client = open_redis(redis_server.url, socket_timeout_s=5.0)
    health = StoreHealth(client)
    health.mark_answering()
    errors: list[tuple[str, str]] = []
    try:
        store = LeaseStore(client, call_budget_s=2.0)
        keeper: LeaseKeeper[Any] = LeaseKeeper(
            store, None, lease_ttl_ms=TTL_MS, health=health,  # type: ignore[arg-type]
            errors=RepeatedErrors(on_count=lambda where, cause: errors.append((where, cause))),
        )  # fmt: skip
        lease, _ = await held_lease(store, keeper, TTL_MS)
        keeper.pressure.measured(0.9)  # a slow round trip earlier closed the gate
        await client.delete(lease.keys.lease)
        await client.set(lease.keys.lease, "not a lease hash")
        heartbeat = asyncio.get_running_loop().create_task(keeper.run())
        try:
            await eventually(lambda: len(errors) >= 2, within=10, what="two failed ticks")
            assert not heartbeat.done(), "the heartbeat ended on a refused renewal"
            assert errors[:2] == [("heartbeat", "ResponseError")] * 2, errors
            assert not health.accepting, "a renewal that failed marks the store failing"
            assert lease.lost is None  # a whole TTL has not passed yet
            # The execution ends (its own settle or loss does this in the worker).
            keeper.remove(keeper.holding(lease.keys.action_id))  # type: ignore[arg-type]
            await eventually(
                lambda: keeper.pressure.accepting, within=10, what="the gate open again"
            )
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
    finally:
        await client.aclose()


async def test_a_tick_that_raises_is_reported_and_the_next_one_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing restarts a heartbeat that ended, so no one tick's error may end it."""
    errors: list[tuple[str, str]] = []
    keeper: LeaseKeeper[Any] = LeaseKeeper(
        None, None, lease_ttl_ms=600,  # type: ignore[arg-type]
        errors=RepeatedErrors(on_count=lambda where, cause: errors.append((where, cause))),
    )  # fmt: skip
    ticks: list[float] = []

    async def failing_then_fine() -> None:
        ticks.append(time.monotonic())
        if len(ticks) == 1:
            raise RuntimeError("a defect in one tick")

    monkeypatch.setattr(keeper, "tick", failing_then_fine)
    monkeypatch.setattr(keeper.notices, "run", asyncio.Event().wait)
    heartbeat = asyncio.get_running_loop().create_task(keeper.run())
    try:
        await eventually(lambda: len(ticks) >= 3, within=10, what="three ticks")
        assert not heartbeat.done()
    finally:
        heartbeat.cancel()
        await asyncio.gather(heartbeat, return_exceptions=True)
    assert errors == [("heartbeat", "RuntimeError")]
