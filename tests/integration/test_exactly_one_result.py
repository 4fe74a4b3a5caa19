"""Kill or pause a worker at any point and still get exactly one settled result.

The tests marked `on_processes_and_containers` run twice: NATS and Redis as local processes,
then as Docker containers (skipped without an engine; see worker/testing/pytest_plugin.py).

Each test runs real worker subprocesses against real NATS and Redis; the lease TTL is 3 s
(AckWait the same), so a takeover happens within a few seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from schemas.audit import ReceiptEvent
from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.testing.fake_hermes import RouteDelay
from worker.testing.pytest_plugin import on_processes_and_containers

MODELS = "GET /v1/models"


@on_processes_and_containers
@pytest.mark.aip_family("idempotency_duplicates", assertions=["duplicate_suppressed"])
async def test_duplicate_deliveries_execute_once_and_both_are_acked(
    stack: Stack, record_property: Callable[[str, object], None]
) -> None:
    stack.fake.faults.add(RouteDelay(route=MODELS, delay_s=1.5, times=1))
    await stack.spawn("w1")
    await stack.spawn("w2")
    action = stack.action("models")
    record_property("aip_artifact", action.id)
    first = await stack.publish(action)
    await stack.publish(action, dedupe=False)  # no Msg-Id: the stream keeps both
    await stack.publish(action)  # same Msg-Id: dropped by the server
    result = await first.result(timeout_s=20)
    assert result.status is ResultStatus.COMPLETED
    info = await stack.settled_and_acked()
    assert info.delivered.stream_seq == 2
    await asyncio.sleep(1.0)
    assert len(await stack.results(action.id)) == 1
    assert stack.fake.stats().count(MODELS) == 1


async def test_replay_after_the_duplicate_window_returns_the_stored_result_once(
    stack: Stack,
) -> None:
    js = stack.nc.jetstream()
    info = await js.stream_info("AIP_HERMES_ACTIONS")
    info.config.duplicate_window = 1.0
    await js.update_stream(info.config)
    await stack.spawn("w1")
    action = stack.action("models")
    result = await (await stack.publish(action)).result(timeout_s=20)
    await stack.settled_and_acked()
    await asyncio.sleep(1.5)
    await stack.publish(action)  # same Msg-Id, outside the window: delivered again
    await asyncio.sleep(0.5)
    info_after = await stack.settled_and_acked()
    assert info_after.delivered.stream_seq == 2
    assert [r.fence for r in await stack.results(action.id)] == [result.fence]
    assert stack.fake.stats().count(MODELS) == 1


@on_processes_and_containers
@pytest.mark.aip_family("restart_reconnect", assertions=["state_recovered"])
async def test_killed_holder_is_replaced_after_its_lease_expires_with_one_result(
    stack: Stack,
) -> None:
    stack.fake.faults.add(RouteDelay(route=MODELS, delay_s=60, times=1))
    w1 = await stack.spawn("w1")
    action = stack.action("models")
    handle = await stack.publish(action)
    await stack.wait_owner(action.id, "w1")
    await stack.spawn("w2")
    w1.kill()
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED
    assert (result.settled_by, result.fence) == ("w2", 2)
    await stack.settled_and_acked()
    assert len(await stack.results(action.id)) == 1
    # `models` does not stream (as upstream AIP): neither owner published a chunk.
    assert await stack.chunks(action.id) == []
    assert result.last_chunk_sha256 is None


@on_processes_and_containers
async def test_paused_holder_never_writes_or_publishes_after_takeover(stack: Stack) -> None:
    stack.fake.faults.add(RouteDelay(route=MODELS, delay_s=8, times=1))
    w1 = await stack.spawn("w1")
    action = stack.action("models")
    handle = await stack.publish(action)
    await stack.wait_owner(action.id, "w1")
    await stack.spawn("w2")
    w1.pause()
    result = await handle.result(timeout_s=30)
    assert (result.settled_by, result.fence) == ("w2", 2)
    w1.resume()
    await asyncio.sleep(8.0)  # w1's delayed request returns meanwhile; it must do nothing
    assert w1.alive
    assert len(await stack.results(action.id)) == 1
    # No chunk from either owner: `models` has no chunk stream, and w1 publishes nothing.
    assert await stack.chunks(action.id) == []
    receipts = await stack.receipts(action.id)
    by_w1 = {r.event for r in receipts if r.worker_id == "w1"}
    assert ReceiptEvent.LEASE_LOST in by_w1
    assert ReceiptEvent.SETTLED not in by_w1
    assert "lease lost" in w1.log_text()


async def test_crash_between_settle_and_publish_is_repaired_by_redelivery(stack: Stack) -> None:
    action = stack.action("models")
    await stack.spawn("w1", fault_points=f"after_settle=exit@{action.id}")
    handle = await stack.publish(action)
    await asyncio.sleep(1.0)
    await stack.spawn("w2")
    result = await handle.result(timeout_s=30)
    assert (result.settled_by, result.fence) == ("w1", 1)
    await stack.settled_and_acked()
    assert len(await stack.results(action.id)) == 1
    assert stack.fake.stats().count(MODELS) == 1


async def test_crash_before_ack_leaves_one_result_and_the_redelivery_is_acked(
    stack: Stack,
) -> None:
    action = stack.action("models")
    await stack.spawn("w1", fault_points=f"before_ack=exit@{action.id}")
    handle = await stack.publish(action)
    await handle.result(timeout_s=20)
    await stack.spawn("w2")
    await stack.settled_and_acked(timeout_s=30)
    assert len(await stack.results(action.id)) == 1
    assert stack.fake.stats().count(MODELS) == 1
