"""The replay boundary through live workers: captured signed bytes do not run twice, and a
queued backlog is never refused (issue 27).

An envelope is accepted only if JetStream stored it while its `created_at_unix_ms` was
inside the window (the stored time is the message's metadata timestamp), and while the
state an earlier delivery left is still kept. Outside it the answer is
`connector_host.replay`: the stored result again when there is one, nothing at all when
the bus already holds this envelope's result, a failed result otherwise; Hermes never
hears of it.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest
from redis.asyncio import Redis

from schemas.action import Action
from schemas.result import ActionResult, ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from worker.store.keys import NAMESPACE, ActionKeys
from worker.wire.results import decode_result

POST_RUNS = "POST /v1/runs"
REPLAY = "connector_host.replay"
#: Short, so a test can wait until a captured envelope is too old.
MAX_AGE_MS = 2_000


@pytest.fixture
def stack_env() -> dict[str, str]:
    return {"AIPD_MAX_ENVELOPE_AGE_MS": str(MAX_AGE_MS)}


def _runs(stack: Stack) -> int:
    assert stack.fake is not None
    return stack.fake.stats().count(POST_RUNS)


async def _send(stack: Stack, payload: bytes) -> None:
    """Publish captured signed Envelope bytes again, as an attacker would: without a
    `Nats-Msg-Id`, so the stream stores every copy (another id's would be dead-lettered,
    the Action's own would be dropped inside the duplicate window)."""
    await stack.nc.jetstream().publish(stack.subjects.actions(ENDPOINT), payload)


async def _stored(stack: Stack, action_id: str, timeout_s: float = 20.0) -> ActionResult:
    """The result stored in Redis for `action_id` (what the worker settled)."""
    client = Redis.from_url(stack.redis_url)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            raw = await client.get(ActionKeys.of(action_id).result)
            if raw is not None:
                return decode_result(raw)[0]
            await asyncio.sleep(0.1)
    finally:
        await client.aclose()
    raise AssertionError(f"no result stored for {action_id}")


async def _forget(stack: Stack, action_id: str) -> int:
    """What expiry does to an Action's runtime state (lease, result, binding, …); the
    approval record is left in place, so only the replay boundary can stop a rerun."""
    client = Redis.from_url(stack.redis_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{NAMESPACE}:{{{action_id}}}:*")]
        return int(await client.delete(*keys)) if keys else 0
    finally:
        await client.aclose()


async def _wait_older_than_window(action: Action) -> None:
    while time.time_ns() // 1_000_000 - action.created_at_unix_ms <= MAX_AGE_MS + 300:
        await asyncio.sleep(0.1)


async def test_a_replay_after_the_state_expired_publishes_nothing_over_the_result(
    stack: Stack,
) -> None:
    """Captured bytes published again once the Action's state expired (the result TTL):
    refused as a replay, and, since the bus still holds that envelope's result, nothing is
    published over it: exactly one result, no second (failed) one."""
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "run exactly once"})
    await stack.approve(action)
    payload = stack.trust.seal_action(action)
    await _send(stack, payload)
    first = await stack.client.handle(ENDPOINT, action.id).result(timeout_s=30)
    assert first.status is ResultStatus.COMPLETED, first.error
    assert _runs(stack) == 1
    assert await _forget(stack, action.id) >= 2  # lease and result at least
    await _wait_older_than_window(action)
    await _send(stack, payload)
    await stack.settled_and_acked()
    assert [r.status for r in await stack.results(action.id)] == [ResultStatus.COMPLETED]
    assert _runs(stack) == 1  # Hermes never heard of the replay
    events = [r.event.value for r in await stack.receipts(action.id)]
    assert "refused" not in events  # nothing new on the audit subject either
    client = Redis.from_url(stack.redis_url)
    try:
        assert await client.get(ActionKeys.of(action.id).result) is None  # nothing settled
    finally:
        await client.aclose()


async def test_a_stale_envelope_never_answered_is_refused_with_a_failed_result(
    stack: Stack,
) -> None:
    """Bytes created longer than the window before JetStream stored them, with no result
    anywhere: refused as a replay with a failed result, so the publisher learns why."""
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "published too late"})
    await stack.approve(action)
    await _wait_older_than_window(action)
    await _send(stack, stack.trust.seal_action(action))
    replayed = await _stored(stack, action.id)
    assert replayed.status is ResultStatus.FAILED
    assert replayed.error is not None
    assert (replayed.error.code, replayed.error.retryable) == (REPLAY, False)
    assert replayed.error.uncertain_outcome is False
    assert "stored" in replayed.error.message
    await stack.settled_and_acked()
    assert _runs(stack) == 0
    refused = [r for r in await stack.receipts(action.id) if r.event.value == "refused"]
    assert [r.details.get("code") for r in refused] == [REPLAY]


async def test_a_backlog_older_than_the_window_is_processed(stack: Stack) -> None:
    """Actions stored while young wait in the queue longer than the window (no worker is
    running: a redeploy, a backlog); the worker that comes up runs every one of them."""
    actions = [stack.action("operator", {"objective": f"queued {n}"}) for n in range(3)]
    handles = []
    for action in actions:
        await stack.approve(action)
        handles.append(await stack.publish(action))
    await _wait_older_than_window(actions[-1])
    await stack.spawn("w1")
    for handle in handles:
        result = await handle.result(timeout_s=30)
        assert result.status is ResultStatus.COMPLETED, result.error
    assert _runs(stack) == 3


async def test_a_republication_of_captured_bytes_after_the_window_is_refused(
    stack: Stack,
) -> None:
    """The genuine Action waits in the queue and runs after the window; a copy of its
    captured bytes, published after the window, is a new message with a new stored time
    and an old `created_at`: refused, never run, and nothing published over the result."""
    # A read, refused before its lease (an operator's copy would be recovered from its
    # binding instead): the refusal itself shows.
    action = stack.action("models")
    payload = stack.trust.seal_action(action)
    await stack.publish(action)
    await _wait_older_than_window(action)
    worker = await stack.spawn("w1")
    first = await stack.client.handle(ENDPOINT, action.id).result(timeout_s=30)
    assert first.status is ResultStatus.COMPLETED, first.error
    await _send(stack, payload)  # the attacker's copy, with a fresh stored time
    await stack.settled_and_acked()
    refused = f"refused {action.id} ({REPLAY}), whose result is already on the bus"
    for _ in range(100):
        if refused in worker.log_text():
            break
        await asyncio.sleep(0.1)
    assert refused in worker.log_text(), worker.log_tail()
    assert stack.fake is not None
    assert stack.fake.stats().count("GET /v1/models") == 1
    assert [r.status for r in await stack.results(action.id)] == [ResultStatus.COMPLETED]


async def test_an_envelope_dated_in_the_future_is_refused(stack: Stack) -> None:
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "from the future"})
    # Beyond the default 30 s skew allowance, on any sane clock.
    action = msgspec.structs.replace(
        action, created_at_unix_ms=action.created_at_unix_ms + 120_000
    )
    await stack.approve(action)
    handle = await stack.publish(action)
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == REPLAY
    assert "future" in result.error.message
    assert _runs(stack) == 0


async def test_an_envelope_within_the_skew_allowance_runs(stack: Stack) -> None:
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "slightly ahead"})
    action = msgspec.structs.replace(action, created_at_unix_ms=action.created_at_unix_ms + 5_000)
    await stack.approve(action)
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error


async def test_a_replay_of_a_settled_action_republishes_its_stored_result(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    # A read: refused before its lease, so the receipts show the replay decision itself.
    action = stack.action("models")
    payload = stack.trust.seal_action(action)
    await _send(stack, payload)
    first = await stack.client.handle(ENDPOINT, action.id).result(timeout_s=30)
    assert first.status is ResultStatus.COMPLETED, first.error
    # The result message is gone from the stream (retention), the stored result is not.
    js = stack.nc.jetstream()
    await js.purge_stream(
        stack.subjects.stream_name("results"), subject=stack.subjects.results(ENDPOINT, action.id)
    )
    assert await stack.results(action.id) == []
    await _wait_older_than_window(action)
    await _send(stack, payload)
    await stack.settled_and_acked()
    # Refused as a replay, answered with the stored result (the stream's duplicate window
    # may drop the copy itself: the same `Nats-Msg-Id` as the first publish).
    events = [
        (r.event.value, r.details.get("code"))
        for r in await stack.receipts(action.id)
        if r.event.value in ("refused", "republished")
    ]
    assert events == [("refused", REPLAY), ("republished", None)]
    assert await _stored(stack, action.id) == first
    assert stack.fake is not None
    assert stack.fake.stats().count("GET /v1/models") == 1
