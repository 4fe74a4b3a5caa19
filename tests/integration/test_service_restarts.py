"""Redis restart (AOF on) and NATS restart during a run (as processes, and as containers
restarted by Docker): no lost or doubled result, and the
pull consumer resumes by itself after the NATS server comes back (nats.py #504)."""

from __future__ import annotations

import asyncio

import pytest

from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.testing.fake_hermes import RouteDelay
from worker.testing.pytest_plugin import on_processes_and_containers
from worker.testing.services import ServiceHandle

MODELS = "GET /v1/models"


@pytest.mark.chaos
@on_processes_and_containers
async def test_redis_restart_during_a_run_loses_and_doubles_nothing(
    stack: Stack, redis_server: ServiceHandle
) -> None:
    stack.fake.faults.add(RouteDelay(route=MODELS, delay_s=2.0, times=1))
    await stack.spawn("w1")
    action = stack.action("models")
    handle = await stack.publish(action)
    await stack.wait_owner(action.id, "w1")
    await asyncio.to_thread(redis_server.kill)
    await asyncio.to_thread(redis_server.restart)
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    # The script cache was emptied by the restart: later Actions still run (NOSCRIPT reload).
    after = await (await stack.publish(stack.action("models"))).result(timeout_s=30)
    assert after.status is ResultStatus.COMPLETED
    await stack.settled_and_acked(timeout_s=30)
    assert len(await stack.results(action.id)) == 1


@on_processes_and_containers
# While a NATS container restarts, Docker's port proxy already accepts connections that the
# server does not answer yet; nats.py's reconnect attempt then drops its StreamWriter
# without closing it ("empty response from server when expecting INFO"). The client's leak,
# not the worker's: the test's and the workers' connections still come back.
@pytest.mark.chaos
@pytest.mark.filterwarnings("ignore:unclosed <StreamWriter:ResourceWarning")
async def test_nats_restart_during_a_run_loses_and_doubles_nothing(
    stack: Stack, nats_server: ServiceHandle
) -> None:
    stack.fake.faults.add(RouteDelay(route=MODELS, delay_s=3.0, times=1))
    await stack.spawn("w1")
    action = stack.action("models")
    await stack.publish(action)
    await stack.wait_owner(action.id, "w1")
    await asyncio.to_thread(nats_server.kill)
    await asyncio.to_thread(nats_server.restart)
    # The test's own connection reconnects too; then the result must be there exactly once.
    handle = stack.client.handle("h1", action.id)
    result = await handle.result(timeout_s=40)
    assert result.status is ResultStatus.COMPLETED, result.error
    # The pull consumer came back by itself: a new Action is served.
    later = await (await stack.publish(stack.action("models"))).result(timeout_s=40)
    assert later.status is ResultStatus.COMPLETED
    await stack.settled_and_acked(timeout_s=40)
    assert len(await stack.results(action.id)) == 1
