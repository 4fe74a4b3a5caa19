"""A swamped event loop keeps its leases: the backstop thread renews them while the
heartbeat is behind, stops when the loop is stuck, and hands what it finds back to the loop.

The loop is swamped the way an overloaded worker's is: many tasks, each running Python for
a while before it yields, so every pass of the loop takes seconds and the heartbeat's
renewal waits for several of them. Real Redis throughout; the executions are what the
heartbeat sees of one (as in `test_heartbeat_pressure`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.integration.held_leases import held_lease
from worker.bus.audit import AuditLog
from worker.errors import LeaseLost
from worker.execution.leases import HeldLease, LeaseKeeper
from worker.execution.renewal_backstop import RenewalBackstop
from worker.store.connection import open_redis
from worker.store.keys import ActionKeys
from worker.store.lease_store import LeaseStore
from worker.testing.services import ServiceHandle, eventually

#: Ticks 2 s apart, a lease trusted for 4.8 s after its last confirmation, the heartbeat
#: "behind" after 3 s, the loop "stuck" after 6 s without a pulse.
TTL_MS = 6_000
#: Each pass of the swamped loop: SWAMP_TASKS tasks running SWAMP_SLICE_S of Python each.
SWAMP_TASKS = 40
SWAMP_SLICE_S = 0.05

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def store(redis_server: ServiceHandle) -> AsyncIterator[LeaseStore]:
    client = open_redis(redis_server.url, socket_timeout_s=5.0)
    try:
        yield LeaseStore(client, call_budget_s=5.0)
    finally:
        await client.aclose()


def _keeper(store: LeaseStore) -> LeaseKeeper[Any]:
    return LeaseKeeper(store, AuditLog(None, "w"), lease_ttl_ms=TTL_MS)


async def _swamp(lease: HeldLease, seconds: float) -> list[str]:
    """Keep the loop swamped for `seconds`; every task checks the lease each time it runs,
    as an execution does before each publish, and the failures are returned."""
    failures: list[str] = []
    until = time.monotonic() + seconds

    async def busy() -> None:
        while time.monotonic() < until:
            spin_until = time.monotonic() + SWAMP_SLICE_S
            while time.monotonic() < spin_until:
                pass
            try:
                lease.check()
            except LeaseLost as lost:
                failures.append(str(lost))
            await asyncio.sleep(0)

    await asyncio.gather(*(busy() for _ in range(SWAMP_TASKS)))
    return failures


async def _expires_in_ms(client: Redis, keys: ActionKeys) -> int:
    """How long Redis still holds the lease for (negative: it lapsed that long ago)."""
    expires_at = int(await client.hget(keys.lease, "expires_at_ms") or 0)
    seconds, micros = await client.time()
    return expires_at - (int(seconds) * 1000 + int(micros) // 1000)


async def _heartbeat_swamped(
    store: LeaseStore, url: str, *, backstop: bool
) -> tuple[list[str], int]:
    """Swamp the loop for 14 s while the heartbeat runs (and the thread, with `backstop`):
    the lease checks that failed, and the thread's answered renewals."""
    keeper = _keeper(store)
    lease, _ = await held_lease(store, keeper, TTL_MS)
    thread = RenewalBackstop(keeper, lambda: open_redis(url))
    heartbeat = asyncio.get_running_loop().create_task(keeper.run())
    if backstop:
        thread.start()
    try:
        failures = await _swamp(lease, 14.0)
    finally:
        heartbeat.cancel()
        await thread.stop()
    return failures, thread.rounds_answered


async def test_a_swamped_loop_keeps_its_leases_through_the_backstop(
    store: LeaseStore, redis_server: ServiceHandle
) -> None:
    failures, rounds = await _heartbeat_swamped(store, redis_server.url, backstop=True)
    assert failures == []
    assert rounds >= 3, "the heartbeat was behind, so the thread renewed"


async def test_without_the_backstop_the_same_swamp_loses_the_lease(
    store: LeaseStore, redis_server: ServiceHandle
) -> None:
    """The control: the swamp above is enough to lose a lease on the heartbeat alone."""
    failures, rounds = await _heartbeat_swamped(store, redis_server.url, backstop=False)
    assert rounds == 0
    assert failures
    assert failures[0] == "lease not confirmed within its TTL"


async def test_the_backstop_sends_nothing_while_the_heartbeat_keeps_up(
    store: LeaseStore, redis_server: ServiceHandle
) -> None:
    keeper = _keeper(store)
    await held_lease(store, keeper, TTL_MS)
    thread = RenewalBackstop(keeper, lambda: open_redis(redis_server.url))
    heartbeat = asyncio.get_running_loop().create_task(keeper.run())
    thread.start()
    try:
        await asyncio.sleep(5.0)  # two ticks and a half
    finally:
        heartbeat.cancel()
        await thread.stop()
    assert keeper.renew_round_trips >= 2
    assert thread.rounds == 0


async def test_a_stuck_loop_keeps_nothing(
    store: LeaseStore, redis_server: ServiceHandle
) -> None:
    """A loop that runs no callback is not kept alive: the thread renews at most once more
    (it renews once per pass of the loop), and the lease lapses in Redis for another worker
    to take."""
    keeper = _keeper(store)
    lease, _ = await held_lease(store, keeper, TTL_MS)
    keeper.confirmed_at -= TTL_MS / 1000  # the heartbeat is behind from the start
    thread = RenewalBackstop(keeper, lambda: open_redis(redis_server.url))
    thread.start()
    try:
        await eventually(lambda: thread.rounds_answered >= 1, within=10, what="a renewal")
        before = thread.rounds
        time.sleep(TTL_MS / 1000 * 2)  # the loop is stuck: no callback runs
        while_stuck = thread.rounds - before
        await asyncio.sleep(0)
    finally:
        await thread.stop()
    assert while_stuck <= 1
    assert await _expires_in_ms(store.redis, lease.keys) < 0, "the lease lapsed"


async def test_a_refusal_and_a_cancel_intent_found_by_the_thread_reach_the_keeper(
    store: LeaseStore, redis_server: ServiceHandle
) -> None:
    keeper = _keeper(store)
    running = asyncio.get_running_loop().create_task(asyncio.sleep(60))
    taken, taken_execution = await held_lease(store, keeper, TTL_MS, task=running)
    cancelled, cancelled_execution = await held_lease(store, keeper, TTL_MS)
    # Another worker takes the first lease over once it lapsed; the second Action gets a
    # durable cancel intent.
    await store.redis.hset(taken.keys.lease, "expires_at_ms", 1)
    grant = await store.acquire(taken.keys, "w#other", TTL_MS, "fp")
    assert grant.fence > taken.fence
    await store.redis.set(cancelled.keys.cancel, b"intent")

    keeper.confirmed_at -= TTL_MS / 1000
    thread = RenewalBackstop(keeper, lambda: open_redis(redis_server.url))
    thread.start()
    try:
        await eventually(
            lambda: taken.lost is not None and cancelled_execution.cancel_requested.is_set(),
            within=10, what="the thread's findings on the loop",
        )  # fmt: skip
    finally:
        await thread.stop()
    assert taken.lost == "renewal refused: another owner holds the lease"
    assert keeper.lost_count == 1
    await asyncio.sleep(0)
    assert running.cancelled()
    assert cancelled.lost is None
    assert not taken_execution.cancel_requested.is_set()


async def test_a_lease_being_settled_is_left_to_its_settle(
    store: LeaseStore, redis_server: ServiceHandle
) -> None:
    """A settle or release in flight tells a real loss by its own answer: the thread does
    not renew that lease (a refusal would only be the settle's doing)."""
    keeper = _keeper(store)
    lease, _ = await held_lease(store, keeper, TTL_MS)
    lease.ending = True
    await store.release(lease.keys, lease.owner, lease.fence)
    keeper.confirmed_at -= TTL_MS / 1000
    thread = RenewalBackstop(keeper, lambda: open_redis(redis_server.url))
    thread.start()
    try:
        await asyncio.sleep(1.0)
    finally:
        await thread.stop()
    assert thread.rounds == 0
    assert lease.lost is None
    assert keeper.lost_count == 0


@pytest.mark.chaos
async def test_a_redis_that_does_not_answer_is_one_log_line_per_spell(
    store: LeaseStore, redis_server: ServiceHandle, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis down fails the heartbeat too, which reports it: the thread says so once, counts
    every failed round trip, and says so again once it renews."""
    keeper = _keeper(store)
    lease, _ = await held_lease(store, keeper, TTL_MS)
    keeper.confirmed_at -= TTL_MS / 1000
    thread = RenewalBackstop(keeper, lambda: open_redis(redis_server.url, socket_timeout_s=1.0))
    caplog.set_level(logging.INFO, logger="worker.execution.renewal_backstop")
    thread.start()
    try:
        await eventually(lambda: thread.rounds_answered >= 1, within=10, what="a renewal")
        redis_server.pause()
        try:
            await eventually(lambda: thread.rounds - thread.rounds_answered >= 3, within=30,
                             what="three failed round trips")  # fmt: skip
        finally:
            redis_server.resume()
        confirmed = lease.renewed_at
        await eventually(lambda: lease.renewed_at > confirmed, within=15, what="renewed again")
    finally:
        await thread.stop()
    said = [r.getMessage() for r in caplog.records]
    renewed, failed = "renewed the 1 held lease(s) from its thread", "renewal failed ("
    assert len(said) == 3, said
    assert renewed in said[0]
    assert failed in said[1]
    assert renewed in said[2]
    assert lease.lost is None
