"""The host and state codes each driven through a live worker by the failure they name:
`connector_host.not_ready`, `connector_host.capacity`, `connector_host.execution`,
`connector.hermes_agent.operator_state` and `connector.hermes_agent.stream_publication`."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from nats.js.api import DiscardPolicy
from redis.asyncio import Redis

from schemas.result import ActionResult, ResultStatus
from tests.aip_actions import cancel_envelope, canonical, key_of_nkey_seed, sign
from tests.aip_wire import envelope, extension
from tests.integration.stack import ENDPOINT, Stack
from worker.store.keys import ActionKeys
from worker.testing.identities import USER_UNTENANTED
from worker.testing.scenario import SLOW_REPLY
from worker.testing.services import ServiceHandle

POST_RUNS = "POST /v1/runs"


def _flags(result: ActionResult) -> tuple[str, bool, bool]:
    assert result.error is not None, result
    return result.error.code.value, result.error.retryable, result.error.uncertain_outcome


async def _until_runs_started(stack: Stack, count: int, timeout_s: float = 20.0) -> None:
    assert stack.fake is not None
    deadline = time.monotonic() + timeout_s
    while stack.fake.stats().count(POST_RUNS) < count:
        assert time.monotonic() < deadline, "the run never started"
        await asyncio.sleep(0.05)


@pytest.mark.chaos
async def test_a_cancel_that_cannot_be_recorded_is_not_ready(
    stack: Stack, redis_server: ServiceHandle
) -> None:
    await stack.spawn("w1")
    await asyncio.to_thread(redis_server.kill)
    try:
        # The Action's own principal asks, so only Redis can stand in the way.
        cancel = sign(
            cancel_envelope(stack.action("models").id, reason="test"),
            key_of_nkey_seed(stack.trust.seed),
            {"id": USER_UNTENANTED, "kind": "human"},
        )
        # The worker spends its 10 s Redis budget before it answers.
        reply_msg = await stack.nc.request(
            stack.subjects.cancel(ENDPOINT), canonical(cancel), timeout=30
        )
    finally:
        await asyncio.to_thread(redis_server.restart)
    reply = envelope(reply_msg.data)
    assert reply["message_type"] == "aip.core.v1.error"
    assert reply["in_response_to"] == cancel["message_id"]
    error = reply["body"]["error"]["error"]
    assert (error["code"], error["category"], error["retryable"]) == (
        "connector_host.not_ready",
        "temporary",
        True,
    )
    assert error["details"]["uncertain_outcome"] is False
    assert extension(reply)["cancel"]["accepted"] is False
    # Nothing was lost: the worker serves again once Redis is back.
    after = await (await stack.publish(stack.action("models"))).result(timeout_s=30)
    assert after.status is ResultStatus.COMPLETED


async def test_an_endpoint_full_until_the_deadline_is_capacity_and_starts_nothing(
    stack: Stack,
) -> None:
    await stack.spawn("w1", AIPD_HERMES_MAX_CONCURRENT_RUNS="1")
    busy, busy_handle = await stack.operator(f"hold the only slot {SLOW_REPLY}")
    await _until_runs_started(stack, 1)
    starved = stack.action(
        "operator",
        {"objective": "no slot for me"},
        deadline_unix_ms=time.time_ns() // 1_000_000 + 2_500,
    )
    await stack.approve(starved)
    result = await (await stack.publish(starved)).result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    # Nothing was started for it, and its id is used up: not retryable, not uncertain.
    assert _flags(result) == ("connector_host.capacity", False, False)
    assert stack.fake is not None
    assert stack.fake.stats().count(POST_RUNS) == 1
    assert (await busy_handle.result(timeout_s=60)).status is ResultStatus.COMPLETED
    assert busy.id != starved.id


async def test_an_unexpected_exception_in_an_execution_settles_once_as_execution(
    stack: Stack,
) -> None:
    action = stack.action("operator", {"objective": "the run is bound, then a bug"})
    worker = await stack.spawn("w1", fault_points=f"after_bind=raise@{action.id}")
    await stack.approve(action)
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    # The run was started: an unsafe operation's unexpected failure is uncertain.
    assert _flags(result) == ("connector_host.execution", False, True)
    assert result.error is not None
    assert "FaultRaised" in result.error.message
    # Settled and acked once: the same failure is not redelivered forever.
    await stack.settled_and_acked(timeout_s=30)
    assert len(await stack.results(action.id)) == 1
    assert stack.fake is not None
    assert stack.fake.stats().count(POST_RUNS) == 1
    assert worker.alive


async def test_a_store_outage_in_an_execution_is_redelivered_not_settled_as_execution(
    stack: Stack,
) -> None:
    # A dependency failure (Redis out for a whole budget) is not a bug of this Action: the
    # delivery is nak'd and the next owner recovers the bound run, instead of an immediate
    # terminal `connector_host.execution` with an uncertain outcome.
    action = stack.action("operator", {"objective": "the run is bound, then redis fails"})
    w1 = await stack.spawn("w1", fault_points=f"after_bind=unavailable@{action.id}")
    await stack.approve(action)
    handle = await stack.publish(action)
    deadline = time.monotonic() + 30
    while "redelivering later" not in w1.log_text():
        assert time.monotonic() < deadline, w1.log_tail()
        await asyncio.sleep(0.05)
    assert await stack.results(action.id) == []
    w1.kill()
    await stack.spawn("w2")
    result = await handle.result(timeout_s=60)
    assert (result.status, result.settled_by) == (ResultStatus.COMPLETED, "w2"), result.error
    assert len(await stack.results(action.id)) == 1
    assert stack.fake is not None
    assert stack.fake.stats().count(POST_RUNS) == 1  # recovered, never started twice


async def test_a_stored_binding_that_does_not_parse_is_operator_state_and_sends_nothing(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "meets a corrupted binding"})
    redis = Redis.from_url(stack.redis_url)
    try:
        await redis.hset(
            ActionKeys.of(action.id).binding,
            mapping={"doc": b"{not a binding", "revision": 1, "state": "running"},
        )
    finally:
        await redis.aclose()
    await stack.approve(action)
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    assert _flags(result) == ("connector.hermes_agent.operator_state", False, False)
    assert result.error is not None
    assert "does not parse" in result.error.message
    assert stack.fake is not None
    assert stack.fake.stats().count(POST_RUNS) == 0


async def test_a_chunk_jetstream_refuses_is_stream_publication(stack: Stack) -> None:
    await stack.spawn("w1")
    js = stack.nc.jetstream()
    name = stack.subjects.stream_name("chunks")
    unlimited = (await js.stream_info(name)).config
    # The chunk stream takes one more message, then refuses every publish.
    await js.update_stream(dataclasses.replace(unlimited, max_msgs=1, discard=DiscardPolicy.NEW))
    action = stack.action(
        "chat_stream",
        {"messages": [{"role": "user", "content": "several words to stream"}]},
    )
    try:
        result = await (await stack.publish(action)).result(timeout_s=60)
    finally:
        await js.update_stream(unlimited)
    assert result.status is ResultStatus.FAILED
    assert _flags(result) == ("connector.hermes_agent.stream_publication", False, True)
    # Once JetStream takes chunks again the delivery is acked with its one result.
    await stack.settled_and_acked(timeout_s=60)
    assert len(await stack.results(action.id)) == 1
    assert stack.fake is not None
    assert stack.fake.stats().count("POST /v1/chat/completions") == 1
