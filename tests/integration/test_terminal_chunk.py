"""One terminal chunk per Action stream, after any crash between the settle and the ack.

The settle stores the terminal chunk beside the result, so whoever republishes the stored
result (the next owner, after the first was killed) republishes the chunk that closes the
stream too (worker/pipeline/outbox.py). Before, a worker killed right after its settle left
the stream without a terminal chunk for good, although the result named one, and
`ActionHandle.chunks()` waited out its idle timeout.

The chunk and result streams' duplicate window is shortened to 1 s here, so a republish that
sent everything again without looking would store a second terminal chunk (or result)
instead of being dropped by the server.

Only a streaming capability has a chunk stream (a non-streaming one's result is its whole
answer, as upstream), so the Actions here are `chat_stream` turns; the last test kills a
worker of a non-streaming one (`models`) at the same points: its result alone is
republished, and no chunk ever reaches its subject.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import pytest
from nats.js.api import StreamConfig
from redis.asyncio import Redis

from schemas.chunk import DoneChunk, ErrorChunk, StreamChunk
from schemas.result import ActionResult, ResultStatus
from subjects.grammar import chunk_msg_id
from tests.integration.stack import ENDPOINT, Stack
from worker.store.keys import ActionKeys
from worker.testing.scenario import SLOW_REPLY

CHAT = "POST /v1/chat/completions"
#: The refused turn's timeout: long enough for w1 to stream part of it, then passed on
#: purpose.
TIMEOUT_MS = 5000


def _turn(text: str = "a short streamed answer") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def _short_duplicate_window(stack: Stack) -> None:
    js = stack.nc.jetstream()
    for kind in ("chunks", "results"):
        info = await js.stream_info(stack.subjects.stream_name(kind))
        config: StreamConfig = info.config
        config.duplicate_window = 1.0
        await js.update_stream(config)


def _terminals(chunks: list[StreamChunk]) -> list[StreamChunk]:
    return [c for c in chunks if isinstance(c, DoneChunk | ErrorChunk)]


async def assert_one_closed_stream(stack: Stack, action_id: str) -> ActionResult:
    """Exactly one result, and a gap-free chunk stream ending in exactly one terminal chunk
    whose hash the result names; the client's chunk iterator ends at it."""
    [result] = await stack.results(action_id)
    raw = await stack.stream_messages("chunks", stack.subjects.chunks(ENDPOINT, action_id))
    chunks = await stack.chunks(action_id)
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert len(_terminals(chunks)) == 1
    assert _terminals(chunks)[0] is chunks[-1]
    assert result.last_chunk_sha256 == hashlib.sha256(raw[-1]).hexdigest()
    seen = [c async for c in stack.client.handle(ENDPOINT, action_id).chunks(idle_timeout_s=10)]
    assert seen[-1].seq == chunks[-1].seq
    return result


async def assert_one_result_without_chunks(stack: Stack, action_id: str) -> ActionResult:
    """A non-streaming capability's Action (as upstream AIP): exactly one result, naming no
    last chunk; its chunk subject empty; and the client's chunk iterator ends on that result
    at once, having yielded nothing."""
    [result] = await stack.results(action_id)
    assert result.last_chunk_sha256 is None
    assert await stack.stream_messages("chunks", stack.subjects.chunks(ENDPOINT, action_id)) == []
    started = time.monotonic()
    seen = [c async for c in stack.client.handle(ENDPOINT, action_id).chunks(idle_timeout_s=10)]
    assert seen == []
    assert time.monotonic() - started < 5, "the iterator ended on the result, not on silence"
    return result


@pytest.mark.parametrize(
    "point",
    [
        "after_settle",
        "after_escalation",
        "after_terminal_chunk",
        "after_result_publish",
        "before_ack",
    ],
)
@pytest.mark.aip_family("streaming_backpressure", assertions=["terminal_chunk_unique"])
async def test_a_kill_between_settle_and_ack_leaves_one_terminal_chunk(
    stack: Stack, point: str
) -> None:
    await _short_duplicate_window(stack)
    action = stack.action("chat_stream", _turn())
    w1 = await stack.spawn("w1", fault_points=f"{point}=exit@{action.id}")
    await stack.publish(action)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    await asyncio.sleep(1.2)  # past the duplicate window: only looking first avoids copies
    await stack.spawn("w2")
    result = await stack.client.handle(ENDPOINT, action.id).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED
    assert (result.settled_by, result.fence) == ("w1", 1)
    await stack.settled_and_acked(timeout_s=30)
    await assert_one_closed_stream(stack, action.id)
    assert stack.fake is not None
    assert stack.fake.stats().count(CHAT) == 1


@pytest.mark.aip_family("streaming_backpressure", assertions=["terminal_chunk_unique"])
async def test_a_terminal_chunk_already_stored_is_not_published_again(stack: Stack) -> None:
    """The crash left the terminal chunk on the stream but not the result (the chunk is
    sent first): the next owner publishes the result only."""
    await _short_duplicate_window(stack)
    action = stack.action("chat_stream", _turn())
    w1 = await stack.spawn("w1", fault_points=f"after_settle=exit@{action.id}")
    await stack.publish(action)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    # What the dead worker's terminal chunk publish would have stored: the stored bytes,
    # under the chunk's Msg-Id (`chunk_msg_id`: seq and the bytes' hash), read straight
    # from Redis.
    redis = Redis.from_url(stack.redis_url)
    try:
        terminal = await redis.get(ActionKeys.of(action.id).terminal)
    finally:
        await redis.aclose()
    assert terminal is not None
    stored_before = await stack.chunks(action.id)
    await stack.nc.jetstream().publish(
        stack.subjects.chunks(ENDPOINT, action.id),
        terminal,
        headers={
            "Nats-Msg-Id": chunk_msg_id(
                action.id, len(stored_before), hashlib.sha256(terminal).hexdigest()
            )
        },
    )
    await asyncio.sleep(1.2)
    await stack.spawn("w2")
    await stack.client.handle(ENDPOINT, action.id).result(timeout_s=30)
    await stack.settled_and_acked(timeout_s=30)
    await assert_one_closed_stream(stack, action.id)


async def test_a_refusal_after_an_earlier_delivery_streamed_continues_its_chain(
    stack: Stack,
) -> None:
    """docs/reliability.md, bug 4: w1 streams part of a turn and dies before its settle;
    the redelivery comes after the Action's deadline and is refused. The refusal's
    terminal chunk used to be made at seq 0 again, a second chunk at a seq the stream held
    (a fork every reader refuses); it now continues the chain w1 left."""
    w1 = await stack.spawn("w1")
    # Built once w1 serves: its deadline runs from here. A slow turn: 40 deltas over ~4 s.
    action = stack.action(
        "chat_stream", _turn(f"{SLOW_REPLY} refuse me later"), timeout_ms=TIMEOUT_MS
    )
    seen: asyncio.Queue[bytes] = asyncio.Queue()

    async def keep(msg: Any) -> None:
        await seen.put(msg.data)

    sub = await stack.nc.subscribe(stack.subjects.chunks(ENDPOINT, action.id), cb=keep)
    await stack.publish(action)
    for _ in range(3):  # killed a few deltas in: the turn is still streaming
        await asyncio.wait_for(seen.get(), 20)
    await sub.unsubscribe()
    w1.kill()
    streamed = await stack.chunks(action.id)
    assert len(streamed) >= 2
    assert not _terminals(streamed)
    deadline_s = (action.created_at_unix_ms + TIMEOUT_MS) / 1000
    await asyncio.sleep(max(0.0, deadline_s + 0.5 - time.time()))
    await stack.spawn("w2")
    result = await stack.client.handle(ENDPOINT, action.id).result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    # The turn may have reached Hermes (an unsafe attempt was recorded): the refusal is
    # that attempt's unknown outcome, naming the refusal's own code.
    assert result.error.code.value == "connector.hermes_agent.transport"
    assert result.error.uncertain_outcome
    assert "connector.hermes_agent.deadline_exceeded" in result.error.message
    await stack.settled_and_acked(timeout_s=30)
    await assert_one_closed_stream(stack, action.id)
    seqs = [c.seq for c in await stack.chunks(action.id)]
    assert seqs == list(range(len(streamed) + 1))


@pytest.mark.parametrize("point", ["after_settle", "after_result_publish", "before_ack"])
async def test_a_kill_between_settle_and_ack_of_a_non_streaming_action_republishes_no_chunk(
    stack: Stack, point: str
) -> None:
    """The settle of a non-streaming Action stores no terminal chunk: the next owner
    republishes the stored result only (once), and the chunk subject stays empty."""
    await _short_duplicate_window(stack)
    action = stack.action("models")
    w1 = await stack.spawn("w1", fault_points=f"{point}=exit@{action.id}")
    await stack.publish(action)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    redis = Redis.from_url(stack.redis_url)
    try:
        assert await redis.get(ActionKeys.of(action.id).terminal) is None
    finally:
        await redis.aclose()
    await asyncio.sleep(1.2)  # past the duplicate window: only looking first avoids copies
    await stack.spawn("w2")
    result = await stack.client.handle(ENDPOINT, action.id).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED
    assert (result.settled_by, result.fence) == ("w1", 1)
    await stack.settled_and_acked(timeout_s=30)
    await assert_one_result_without_chunks(stack, action.id)
