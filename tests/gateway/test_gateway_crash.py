"""Two gateway processes; one dies (kill -9 equivalents) mid-call; the other finishes.

No gateway holds authority in memory: the survivor's recovery sweep reads the queue entry
and the child's result from the bus and completes the records. The child keeps its one id
(the queue stream never sees another), runs once (the fake Hermes counts its reads), and a
re-publish of a child that was already sent is dropped (`Nats-Msg-Id` = its id).
"""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import pytest

from schemas.lifecycle import LifecycleState
from worker.testing._procs import free_port
from worker.testing.fake_hermes.faults import RouteDelay
from worker.testing.gateway import call_tool
from worker.testing.services import ServiceHandle

from .conftest import H1_TOKEN, GatewayStack, bus_id
from .test_gateway_tools import aip_call, contract, models_reads, queue_history, wait_terminal


async def queue_subjects(gs: GatewayStack) -> set[str]:
    """Every child id that ever got a queue entry."""
    js = gs.stack.nc.jetstream()
    info = await js.stream_info(gs.stack.subjects.runtime_stream_name("queue"), subjects_filter=">")
    return set((info.state.subjects or {}).keys())


async def results_of(gs: GatewayStack, child_id: str) -> list[dict[str, object]]:
    messages = await gs.stack.stream_messages("results", gs.stack.subjects.results("h1", child_id))
    return [msgspec.json.decode(m) for m in messages]


async def call_dying_gateway(url: str, arguments: dict[str, object]) -> None:
    """The caller of a gateway that dies under it sees a broken call (and nothing else)."""
    with contextlib.suppress(Exception, BaseExceptionGroup):
        async with asyncio.timeout(10):
            await call_tool(url, H1_TOKEN, "aip_call", arguments)


@pytest.mark.chaos
@pytest.mark.parametrize("point", ["gateway_after_enqueue", "gateway_after_dispatch"])
async def test_a_gateway_killed_mid_call_is_finished_by_the_other(
    gstack: GatewayStack, point: str
) -> None:
    gs = gstack
    assert gs.stack.fake is not None
    if point == "gateway_after_dispatch":
        # The child is still running when the survivor finds its entry `queued` (the dead
        # gateway sent it but never recorded that): the survivor sends it again.
        gs.stack.fake.faults.add(RouteDelay(route="GET /v1/models", delay_s=4.0))
    arguments = contract()
    child_id = bus_id(arguments)
    dying_port = free_port()
    dying = await gs.start_gateway(
        "g-dying", port=dying_port, AIPD_FAULT_POINTS=f"{point}=exit@{child_id}"
    )
    survivor = await gs.start_gateway("g-survivor")
    await call_dying_gateway(f"http://127.0.0.1:{dying_port}/mcp", arguments)
    assert await asyncio.to_thread(dying.wait_exit, 10) == 137

    found = await wait_terminal(gs, child_id, timeout_s=30)
    assert found.queue is not None
    assert found.queue.state is LifecycleState.COMPLETED
    assert found.lifecycle is not None
    assert found.lifecycle.result is not None
    assert found.lifecycle.result.status == "completed"
    # One child, one id, one execution, one result: the survivor re-sent the child under
    # the same Nats-Msg-Id, which JetStream dropped when the first send had happened.
    assert await queue_subjects(gs) == {gs.stack.subjects.runtime_queue(child_id)}
    assert models_reads(gs) == 1
    assert len(await results_of(gs, child_id)) == 1
    assert await queue_history(gs, child_id) == ["queued", "running", "completed"]
    assert "dispatched again" in survivor.log_text()
    # The caller (Hermes, reconnecting to any gateway) reads the same child's result.
    own = {"action_id": arguments["action_id"]}
    answer = await call_tool(gs.url, H1_TOKEN, "aip_action_result", own)
    assert answer.body["status"] == "completed"
    # Asking again with the same contract returns that child, never a new one.
    again = await aip_call(gs, H1_TOKEN, arguments)
    assert again.aip["action_id"] == arguments["action_id"]
    assert again.aip["duplicate"] is True
    assert models_reads(gs) == 1


@pytest.mark.chaos
async def test_a_gateway_killed_while_following_is_finished_by_the_other(
    gstack: GatewayStack,
) -> None:
    gs = gstack
    assert gs.stack.fake is not None
    gs.stack.fake.faults.add(RouteDelay(route="GET /v1/models", delay_s=3.0))
    arguments = contract()
    child_id = bus_id(arguments)
    dying_port = free_port()
    dying = await gs.start_gateway("g-dying", port=dying_port)
    await gs.start_gateway("g-survivor")
    call = asyncio.create_task(call_dying_gateway(f"http://127.0.0.1:{dying_port}/mcp", arguments))
    for _ in range(100):
        if "running" in await queue_history(gs, child_id):
            break
        await asyncio.sleep(0.05)
    dying.kill()  # kill -9 while it follows the child
    await call
    found = await wait_terminal(gs, child_id, timeout_s=30)
    assert found.queue is not None
    assert found.queue.state is LifecycleState.COMPLETED
    assert await queue_subjects(gs) == {gs.stack.subjects.runtime_queue(child_id)}
    assert models_reads(gs) == 1
    assert await queue_history(gs, child_id) == ["queued", "running", "completed"]


@pytest.mark.chaos
async def test_a_nats_restart_while_following_loses_nothing(
    gs_up: GatewayStack, nats_server: ServiceHandle
) -> None:
    gs = gs_up
    assert gs.stack.fake is not None
    gs.stack.fake.faults.add(RouteDelay(route="GET /v1/models", delay_s=4.0))
    arguments = contract(mode="async")
    child_id = bus_id(arguments)
    answer = await aip_call(gs, H1_TOKEN, arguments)
    assert answer.document["ack"]["status"] == "accepted", answer.document
    await asyncio.to_thread(nats_server.kill)
    await asyncio.to_thread(nats_server.restart)
    found = await wait_terminal(gs, child_id, timeout_s=40)
    assert found.queue is not None
    assert found.queue.state is LifecycleState.COMPLETED
    assert found.lifecycle is not None
    assert found.lifecycle.result is not None
    assert found.lifecycle.result.status == "completed"
    assert models_reads(gs) == 1
    assert len(await results_of(gs, child_id)) == 1
    # The gateway serves again after the restart.
    ready = await call_tool(
        gs.url, H1_TOKEN, "aip_action_status", {"action_id": arguments["action_id"]}
    )
    assert ready.body["state"] == "completed"
