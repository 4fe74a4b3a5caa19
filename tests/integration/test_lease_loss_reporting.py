"""Lease-loss reporting tells the truth (issue 19): `leases_lost_total`, the metric operators
alert on, counts every real loss once, whichever check found it, and never a settle."""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.audit import ReceiptEvent
from schemas.result import ResultStatus
from tests.integration.conftest import LEASE_TTL_MS
from tests.integration.stack import ENDPOINT, Stack
from worker.testing.services import ServiceHandle, free_port
from worker.testing.workers import WorkerProcess

LOST_LINE = "lease lost for"


async def test_a_settle_is_not_reported_as_a_lost_lease(stack: Stack) -> None:
    # Hold the event loop right after each settle (which gives the lease back) so the
    # overdue heartbeat renews a lease its owner no longer holds, before it is dropped.
    port = free_port()
    worker = await stack.spawn(
        "w1", fault_points="after_settle=sleep:2", AIPD_METRICS_PORT=str(port)
    )
    for _ in range(2):
        result = await (await stack.publish(stack.action("models"))).result(timeout_s=30)
        assert result.status is ResultStatus.COMPLETED
    await stack.settled_and_acked()
    await asyncio.sleep(LEASE_TTL_MS / 1000)  # every tick that could report has run

    scrape = await _scrape(port)
    assert _value(scrape, "aip_hermes_worker_heartbeat_round_trips_total", result="ok") > 0
    assert _value(scrape, "aip_hermes_worker_leases_lost_total", endpoint=ENDPOINT) == 0
    assert (
        _value(scrape, "aip_hermes_worker_fence_rejections_total", endpoint=ENDPOINT, step="renew")
        == 0
    )
    assert LOST_LINE not in worker.log_text()


@pytest.mark.chaos
async def test_a_settle_waiting_out_a_redis_outage_longer_than_the_ttl_is_not_a_loss(
    stack: Stack, redis_server: ServiceHandle
) -> None:
    # Redis goes away just before the settle is sent and comes back after more than a lease
    # TTL: the heartbeat finds no successful renewal for a whole TTL while the settle, re-asked
    # within its own budget, then succeeds (the lease hash is still this owner's). The lease
    # was never lost, so nothing may be counted or logged as lost.
    # NATS must not hand the Action out again meanwhile (ack_wait is one TTL here, and no
    # in-progress ack is sent without a renewal): a redelivery taking the expired lease over
    # before the settle's retry lands is a real loss, and is reported as one.
    jsm = stack.nc.jetstream()
    stream = stack.subjects.stream_name("actions")
    consumer = await jsm.consumer_info(stream, stack.subjects.durable(ENDPOINT, "actions"))
    consumer.config.ack_wait = 60
    await jsm.add_consumer(stream, consumer.config)
    action = stack.action("models")
    port = free_port()
    worker = await stack.spawn(
        "w1", fault_points=f"after_execute=sleep:1@{action.id}", AIPD_METRICS_PORT=str(port)
    )
    handle = await stack.publish(action)
    await _until_logged(worker, f"fault point after_execute for {action.id}")
    await asyncio.to_thread(redis_server.stop)
    await asyncio.sleep(LEASE_TTL_MS / 1000 + 1.5)
    await asyncio.to_thread(redis_server.start)
    result = await handle.result(timeout_s=30)
    assert (result.status, result.settled_by) == (ResultStatus.COMPLETED, "w1")
    assert "lease renewal failed" in worker.log_text()  # the renewals did fail meanwhile
    assert worker.log_text().count(f"fault point after_execute for {action.id}") == 1

    scrape = await _scrape(port)
    assert _value(scrape, "aip_hermes_worker_leases_lost_total", endpoint=ENDPOINT) == 0
    assert LOST_LINE not in worker.log_text()
    events = [r.event for r in await stack.receipts(action.id)]
    assert ReceiptEvent.LEASE_LOST not in events


async def test_a_loss_found_by_the_local_validity_check_is_counted_and_logged_once(
    stack: Stack,
) -> None:
    action = stack.action("models")
    port = free_port()
    # A stall between the provider answer and the settle longer than a lease TTL, plus the
    # one renewal the backstop thread may still send while the loop runs nothing (it
    # renews once per pass of the loop, `RenewalBackstop`): the worker resumes straight
    # into its local validity check, no renewal within the TTL.
    stalled = await stack.spawn(
        "w1",
        fault_points=f"after_execute=sleep:{2 * LEASE_TTL_MS / 1000 + 1}@{action.id}",
        AIPD_METRICS_PORT=str(port),
    )
    await stack.publish(action)
    await _until_logged(stalled, LOST_LINE)

    # The unacked delivery comes back to the same stalled worker, which loses it again at
    # the next fence: a new, real loss. The scrape is answered only between two stalls,
    # so the log read right after it shows the same losses the metric counted.
    scrape = await _scrape(port)
    log = stalled.log_text()
    stalled.kill()
    lost = _value(scrape, "aip_hermes_worker_leases_lost_total", endpoint=ENDPOINT)
    fences = re.findall(rf"{LOST_LINE} {action.id} \(fence (\d+)\)", log)
    assert lost >= 1
    assert lost == len(fences) == len(set(fences))  # each loss counted and logged once
    assert log.count("lease not confirmed within its TTL") == len(fences)
    receipts = [r for r in await stack.receipts(action.id) if r.event is ReceiptEvent.LEASE_LOST]
    receipt_fences = [str(r.fence) for r in receipts]
    assert len(receipt_fences) == len(set(receipt_fences))
    assert set(fences) <= set(receipt_fences)
    assert await stack.results(action.id) == []  # the stalled worker settled nothing

    await stack.spawn("w2")
    result = await stack.client.handle(ENDPOINT, action.id).result(timeout_s=30)
    assert (result.status, result.settled_by) == (ResultStatus.COMPLETED, "w2")


async def _until_logged(worker: WorkerProcess, text: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in worker.log_text():
        assert time.monotonic() < deadline, worker.log_tail()
        await asyncio.sleep(0.1)


async def _scrape(port: int) -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        return await response.text()


def _value(scrape: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0
