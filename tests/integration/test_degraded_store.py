"""Degraded Redis: a worker fetches only while its store answers and has room.

Three real worker processes share one queue; one of them reaches Redis through a TCP relay
the test controls, so its store can stop answering (a hung Redis or a partition: packets
swallowed) or refuse connections, while the others' store is fine. The canary Action's
latency must stay low: the sick worker pauses its fetching instead of holding Actions for
its whole store budget (before: 21.8 s median). A Redis at `maxmemory` must keep finished
work finished (settles succeed) while new work waits, and a failing worker's log must stay
small.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from urllib.parse import urlsplit

import pytest
import redis.asyncio
from redis.exceptions import OutOfMemoryError

from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.client import ActionHandle
from worker.store.keys import ActionKeys
from worker.testing._procs import free_ports
from worker.testing.fake_hermes import RouteDelay
from worker.testing.services import ServiceHandle, eventually

MODELS = "GET /v1/models"
#: Redis is checked every 200 ms (the default is 1 s), so the tests need not wait long.
FAST_CHECKS = "200"


class RedisRelay:
    """A TCP relay in front of Redis for one worker: forwards, swallows, or refuses."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        #: The upstream URL's database, so the relayed worker shares the others' keys.
        self.database = parts.path or "/0"
        self.port = free_ports(1)[0]
        self.swallowing = False
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}{self.database}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self.writers.add(up_writer)
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )
        for w in (writer, up_writer):
            w.close()
            self.writers.discard(w)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65_536):
            if self.swallowing:
                continue  # a hung server: the bytes arrive, nothing comes back
            writer.write(data)
            await writer.drain()

    def swallow(self) -> None:
        self.swallowing = True

    async def refuse(self) -> None:
        """Close the listener and every connection: new connects are refused."""
        assert self.server is not None
        self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        await self.server.wait_closed()

    async def close(self) -> None:
        if self.server is not None and self.server.is_serving():
            await self.refuse()


async def _canary_latencies(stack: Stack, rounds: int, per_round: int = 3) -> list[float]:
    """Publish→result latency of `models` canaries, `per_round` at once every 0.3 s (so a
    fetch can take several, as under real load)."""

    async def one() -> float:
        started = time.monotonic()
        handle = await stack.publish(stack.action("models"))
        result = await handle.result(timeout_s=60)
        assert result.status is ResultStatus.COMPLETED, result.error
        return time.monotonic() - started

    waiting: list[asyncio.Task[float]] = []
    for _ in range(rounds):
        waiting.extend(asyncio.create_task(one()) for _ in range(per_round))
        await asyncio.sleep(0.3)
    return sorted(await asyncio.gather(*waiting))


async def _one_sick_worker(stack: Stack, redis_server: ServiceHandle, fail: str) -> None:
    relay = RedisRelay(redis_server.url)
    await relay.start()
    try:
        await stack.spawn("w1", AIPD_REDIS_CHECK_INTERVAL_MS=FAST_CHECKS)
        await stack.spawn("w2", AIPD_REDIS_CHECK_INTERVAL_MS=FAST_CHECKS)
        sick = await stack.spawn(
            "w3", AIPD_REDIS_URL=relay.url, AIPD_REDIS_CHECK_INTERVAL_MS=FAST_CHECKS
        )
        before = await _canary_latencies(stack, 3)
        if fail == "swallow":
            relay.swallow()
        else:
            await relay.refuse()
        failing_since = time.monotonic()
        # The gate closes within a check interval plus the 1 s ping timeout (the worker logs
        # it as it closes); an Action the sick worker fetched before that waits at most the
        # acquire budget, then is nak'd.
        deadline = failing_since + 10.0
        while "fetching paused" not in sick.log_text():
            assert time.monotonic() < deadline, sick.log_tail()
            await asyncio.sleep(0.05)
        print(f"\ngate closed {time.monotonic() - failing_since:.2f} s after redis {fail}")
        latencies = await _canary_latencies(stack, 10)
        median = statistics.median(latencies)
        p90 = latencies[int(len(latencies) * 0.9)]
        print(
            f"\ncanary latency with one of three workers' redis {fail}: median "
            f"{median * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms"
            f" over {len(latencies)} (healthy: median {statistics.median(before) * 1000:.0f} ms)"
        )
        # What these bounds catch: a sick worker holding the canaries it takes for its
        # whole store budget (21.8 s median before the gate), a third of them. Quiet, the
        # median is ~11 ms; the bounds leave room for the suite's load, which once put a
        # sibling test's p90 at 1.45 s (test_a_worker_started_without_redis_...).
        assert median < 1.0, latencies
        # A hung Redis leaves one residual tail: a fetch the sick worker sent just before its
        # gate closed may still take canaries (up to the 2 s fetch window); each is nak'd and
        # comes back after the nak delay, once or twice (seen: p90 3.0 s in 1 of ~8 runs). A
        # refused Redis fails every call at once, so its tail stays short.
        assert p90 < (2.5 if fail == "refused" else 4.0), latencies
        # The sick worker noticed and stopped fetching; its log stays a few lines long.
        await asyncio.sleep(max(0.0, 10.0 - (time.monotonic() - failing_since)))
        log = sick.log_text()
        assert "fetching paused" in log, sick.log_tail()
        lines = log.splitlines()
        print(f"sick worker log: {len(lines)} lines, {len(log)} bytes after >= 10 s failing")
        assert len(lines) < 40, sick.log_tail(60)
        assert "Traceback" not in log
    finally:
        await relay.close()


async def test_a_hung_redis_on_one_of_three_workers_keeps_the_canary_fast(
    stack: Stack, redis_server: ServiceHandle
) -> None:
    await _one_sick_worker(stack, redis_server, "swallow")


async def test_a_refused_redis_on_one_of_three_workers_keeps_the_canary_fast(
    stack: Stack, redis_server: ServiceHandle
) -> None:
    await _one_sick_worker(stack, redis_server, "refused")


async def test_a_worker_started_without_redis_takes_no_work_from_the_others(
    stack: Stack, refused_port: int
) -> None:
    """The attack pass's setup: one of three workers cannot reach Redis from the start."""
    dead_port = refused_port
    await stack.spawn("w1", AIPD_REDIS_CHECK_INTERVAL_MS=FAST_CHECKS)
    await stack.spawn("w2", AIPD_REDIS_CHECK_INTERVAL_MS=FAST_CHECKS)
    sick = await stack.spawn(
        "w3",
        wait=False,
        AIPD_REDIS_URL=f"redis://127.0.0.1:{dead_port}/0",
        AIPD_REDIS_CHECK_INTERVAL_MS=FAST_CHECKS,
    )
    await eventually(
        lambda: "waiting for redis" in sick.log_text(), within=20, what="the wait log"
    )
    latencies = await _canary_latencies(stack, 10)
    median = statistics.median(latencies)
    p90 = latencies[int(len(latencies) * 0.9)]
    print(
        f"\ncanary latency with one of three workers started without redis: median "
        f"{median * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms"
    )
    # A canary the sick worker took would come back only after AckWait (the stack's 3 s
    # lease TTL), and it would take about a third of them: p90 would be 3 s or more. The
    # bounds leave room for the suite's load (p90 was 1.45 s once in a full CI run).
    assert median < 1.0, latencies
    assert p90 < 2.5, latencies
    assert sick.alive
    assert "bound to consumer" not in sick.log_text()


async def test_start_up_waits_for_redis_and_gives_up_clearly(stack: Stack) -> None:
    (dead_port,) = free_ports(1)
    worker = await stack.spawn(
        "w-dead",
        wait=False,
        AIPD_REDIS_URL=f"redis://127.0.0.1:{dead_port}/0",
        AIPD_REDIS_STARTUP_WAIT_S="3",
        AIPD_REDIS_CHECK_INTERVAL_MS=FAST_CHECKS,
    )
    code = await asyncio.to_thread(worker.wait_exit, 20.0)
    log = worker.log_text()
    assert code == 3, log
    assert f"waiting for redis at 127.0.0.1:{dead_port}" in log
    assert "did not answer within 3 s" in log
    assert "bound to consumer" not in log  # it never took a message from the queue
    info = await stack.consumer()
    assert info.num_waiting == 0


@pytest.mark.chaos
async def test_a_redis_at_maxmemory_keeps_finished_work_finished(
    stack: Stack, redis_server: ServiceHandle
) -> None:
    assert stack.fake is not None
    admin = redis.asyncio.Redis.from_url(redis_server.url)
    filler = 0
    try:
        for worker_id in ("w1", "w2"):
            await stack.spawn(
                worker_id,
                AIPD_REDIS_MEMORY_RESERVE_MB="1",
                AIPD_CONCURRENCY="16",
                AIPD_REDIS_CHECK_INTERVAL_MS=FAST_CHECKS,
            )
        # Work in flight: leased, Hermes answers in 3 s.
        stack.fake.faults.add(RouteDelay(route=MODELS, delay_s=3.0, times=12))
        running = [await stack.publish(stack.action("models")) for _ in range(12)]
        await eventually(  # all in flight
            lambda: _leased(admin, running, 12), within=20, what="12 leases"
        )
        # Redis is full now: filled to maxmemory, then maxmemory lowered below what is
        # used, so noeviction refuses every ordinary write until memory is freed.
        used = int((await admin.info("memory"))["used_memory"])
        await admin.config_set("maxmemory", str(used + 2 * 1024 * 1024))
        with contextlib.suppress(OutOfMemoryError):
            while True:
                await admin.set(f"filler:{filler}", b"x" * 65_536)
                filler += 1
        used = int((await admin.info("memory"))["used_memory"])
        await admin.config_set("maxmemory", str(used - 512 * 1024))
        with contextlib.suppress(OutOfMemoryError):
            await admin.set("filler:probe", b"x")
            raise AssertionError("redis still accepts writes")
        # New work arrives while Redis is full: not leased, not failed.
        waiting = [await stack.publish(stack.action("models")) for _ in range(6)]
        results = [await handle.result(timeout_s=30) for handle in running]
        statuses = [r.status for r in results]
        assert statuses == [ResultStatus.COMPLETED] * 12, [r.error for r in results]
        await asyncio.sleep(1.0)
        assert await _leased(admin, waiting, 0, exactly=True), "new work leased at maxmemory"
        for handle in waiting:
            assert await stack.results(handle.action_id) == []
        # Memory freed: the waiting work runs.
        for i in range(filler):
            await admin.delete(f"filler:{i}")
        filler = 0
        later = [await handle.result(timeout_s=30) for handle in waiting]
        assert [r.status for r in later] == [ResultStatus.COMPLETED] * 6
        for worker in stack.workers:
            log = worker.log_text()
            print(f"{worker.worker_id}: {len(log.splitlines())} log lines while full")
            assert len(log.splitlines()) < 60, worker.log_tail(60)
            assert "Traceback" not in log
    finally:
        await admin.config_set("maxmemory", "0")
        for i in range(filler):
            await admin.delete(f"filler:{i}")
        await admin.aclose()


async def _leased(
    admin: redis.asyncio.Redis, handles: list[ActionHandle], count: int, *, exactly: bool = False
) -> bool:
    found = 0
    for handle in handles:
        if await admin.exists(ActionKeys.of(handle.action_id).lease):
            found += 1
    return found == count if exactly else found >= count
