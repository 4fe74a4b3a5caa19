"""The store gate against a real Redis, and the once-per-cause error log."""

from __future__ import annotations

import logging
import time

import pytest
import redis.asyncio

from worker.errors import StoreNotAccepting, StoreUnavailable
from worker.logs import RepeatedErrors
from worker.metrics import Metrics
from worker.store.connection import open_redis
from worker.store.health import StoreHealth, is_refused
from worker.store.keys import ActionKeys
from worker.store.lease_store import LeaseStore
from worker.testing._procs import free_ports
from worker.testing.services import ServiceHandle

MIB = 1024 * 1024


@pytest.mark.chaos
async def test_the_gate_closes_within_the_reserve_of_maxmemory_and_reopens(
    redis_server: ServiceHandle,
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    metrics = Metrics(worker_id="w")
    health = StoreHealth(client, reserve_bytes=4 * MIB, metrics=metrics)
    store = LeaseStore(client, health=health)
    keys = ActionKeys.of("act_" + "b" * 32)
    try:
        assert await health.check()
        for i in range(40):
            await client.set(f"ballast:{i}", b"x" * MIB)
        used = int((await client.info("memory"))["used_memory"])
        # 2 MiB free below a ~42 MiB limit: inside the 4 MiB reserve.
        await client.config_set("maxmemory", str(used + 2 * MIB))
        assert not await health.check()
        assert health.answering
        assert not health.has_room
        assert metrics.store_accepting._value.get() == 0
        with pytest.raises(StoreNotAccepting):
            await store.acquire(keys, "w#1", 5_000, "f" * 64)
        assert await client.exists(keys.lease) == 0  # nothing was written
        await client.config_set("maxmemory", "0")
        assert await health.check()
        grant = await store.acquire(keys, "w#1", 5_000, "f" * 64)
        assert grant.fence == 1
    finally:
        await client.config_set("maxmemory", "0")
        await client.aclose()


@pytest.mark.chaos
async def test_a_small_maxmemory_reserves_a_quarter_of_it(redis_server: ServiceHandle) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    health = StoreHealth(client, reserve_bytes=1024 * MIB)
    try:
        used = int((await client.info("memory"))["used_memory"])
        # 1 GiB reserve, but maxmemory is ~used + 8 MiB: the reserve is a quarter of it.
        await client.config_set("maxmemory", str(used + 8 * MIB))
        limit = used + 8 * MIB
        assert limit // 4 <= 8 * MIB  # a quarter of ~9 MiB is reserved, 8 MiB are free
        assert await health.check()
        await client.config_set("maxmemory", str(used + 100 * 1024))
        assert not await health.check()  # 100 KiB free is less than a quarter of the limit
    finally:
        await client.config_set("maxmemory", "0")
        await client.aclose()


async def test_a_refused_connection_fails_fast_and_start_up_gives_up_in_time() -> None:
    (port,) = free_ports(1)
    client = open_redis(f"redis://127.0.0.1:{port}/0")  # the worker's own client settings
    health = StoreHealth(client, check_interval_s=0.1)
    store = LeaseStore(client, call_budget_s=10.0)
    try:
        assert not await health.check()
        assert health.reason == "connection refused"
        assert not await health.wait_ready(0.5, what=f"127.0.0.1:{port}")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="redis did not answer"):
            await store.acquire(ActionKeys.of("act_" + "c" * 32), "w#1", 5_000, "f" * 64)
        assert time.monotonic() - started < 1.0  # not the 10 s store budget
    finally:
        await client.aclose()


def test_is_refused_reads_the_cause_chain() -> None:
    wrapped = OSError("wrapped")
    wrapped.__cause__ = ConnectionRefusedError(111, "refused")
    assert is_refused(wrapped)
    assert not is_refused(TimeoutError("slow"))


def test_repeated_errors_are_logged_once_per_cause_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    counted: list[tuple[str, str]] = []
    errors = RepeatedErrors(
        10.0, on_count=lambda w, c: counted.append((w, c)), clock=lambda: now[0]
    )
    logger = logging.getLogger("test.repeated")
    with caplog.at_level(logging.WARNING, logger="test.repeated"):
        for _ in range(1_000):
            errors.report("delivery", "OutOfMemoryError", logger, "failed")
        errors.report("delivery", "TimeoutError", logger, "failed")
        now[0] = 10.5
        errors.report("delivery", "OutOfMemoryError", logger, "failed")
    assert [r.getMessage() for r in caplog.records] == [
        "failed",
        "failed",
        "failed (999 more like it since the last such line, not logged)",
    ]
    assert len(counted) == 1_002


@pytest.mark.chaos
async def test_an_acl_user_refused_info_keeps_the_gate_open_without_the_memory_check(
    redis_server: ServiceHandle, caplog: pytest.LogCaptureFixture
) -> None:
    # A worker ACL user without +info (compose's grants it; a hand-made one may not): PING
    # answers, so the store works and fetching must go on; only the reserve check is off.
    admin = redis.asyncio.Redis.from_url(redis_server.url)
    await admin.execute_command(
        "ACL", "SETUSER", "noinfo", "on", ">pw-noinfo", "~*", "resetchannels", "+@all", "-info"
    )
    client = redis.asyncio.Redis.from_url(
        redis_server.url, username="noinfo", password="pw-noinfo"
    )
    metrics = Metrics(worker_id="w")
    errors = RepeatedErrors(on_count=metrics.error)
    health = StoreHealth(client, metrics=metrics, errors=errors)
    store = LeaseStore(client, health=health)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.info("memory")
        with caplog.at_level(logging.WARNING, logger="worker.store.health"):
            assert await health.check()
            assert await health.check()  # INFO is not asked again
            assert await health.wait_ready(1.0, what="test")
        assert (health.answering, health.has_room, health.memory_check) == (True, True, False)
        assert metrics.store_accepting._value.get() == 1
        refused = [r for r in caplog.records if "refuses INFO" in r.getMessage()]
        assert len(refused) == 1
        assert metrics._errors.labels("store.check", "info refused")._value.get() == 1
        grant = await store.acquire(ActionKeys.of("act_" + "c" * 32), "w#1", 5_000, "f" * 64)
        assert grant.fence == 1
    finally:
        await client.aclose()
        await admin.execute_command("ACL", "DELUSER", "noinfo")
        await admin.aclose()
