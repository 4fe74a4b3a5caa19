"""`queue_pending` and `queue_in_flight` report the pool's backlog from the work consumer
itself (worker/bus/queue_depth.py): what docs/kubernetes.md scales on without KEDA, and
what KEDA's `nats-jetstream` trigger reads too. A real worker process, scraped over HTTP;
Actions held in the fake Hermes so some are in flight and the rest wait."""

from __future__ import annotations

import asyncio

from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_escalations_open import _scrape, value
from worker.testing.fake_hermes import RouteDelay
from worker.testing.services import free_port

MODELS = "GET /v1/models"
PENDING = "aip_hermes_worker_queue_pending"
IN_FLIGHT = "aip_hermes_worker_queue_in_flight"


async def _depth(port: int) -> tuple[float | None, float | None]:
    text = await _scrape(port)
    labels = {"endpoint": ENDPOINT, "queue": "actions"}
    return value(text, PENDING, **labels), value(text, IN_FLIGHT, **labels)


async def _until(port: int, expected: tuple[float, float], timeout_s: float = 20.0) -> None:
    depth: tuple[float | None, float | None] = (None, None)
    for _ in range(int(timeout_s / 0.25)):
        depth = await _depth(port)
        if depth == expected:
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"queue depth {depth}, expected {expected}")


async def test_the_backlog_is_reported_pending_and_in_flight_then_drains(stack: Stack) -> None:
    port = free_port()
    stack.fake.faults.add(RouteDelay(route=MODELS, delay_s=8.0, times=2))
    await stack.spawn(
        "w1", AIPD_METRICS_PORT=str(port), AIPD_QUEUE_DEPTH_REFRESH_MS="0", AIPD_CONCURRENCY="2"
    )
    handles = [await stack.publish(stack.action("models")) for _ in range(5)]
    # Two leased and held by the slow Hermes, three waiting on the queue.
    await _until(port, (3.0, 2.0))
    results = [await handle.result(timeout_s=60) for handle in handles]
    assert {r.status for r in results} == {ResultStatus.COMPLETED}
    await _until(port, (0.0, 0.0))
