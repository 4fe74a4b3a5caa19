"""A hostile or broken Hermes cannot starve a worker nor leave an Action redelivering forever.

Through a live worker process and the fake Hermes' faults: a stream of lines that are never
an event (endless blank lines, endless comment frames) ends typed while a canary Action on
the same worker keeps finishing on time; an answer too large for one bus message fails
typed, with exactly one result and no redelivery loop.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from schemas.errors import ErrorCode
from schemas.result import ActionResult, ResultStatus
from tests.integration.stack import Stack
from worker.testing.fake_hermes import EventsHugeAnswer, EventsNoise

#: Seconds a canary `models` read may take while the hostile stream is being read. Alone it
#: takes ~20 ms; before the decoder yielded, the hostile stream held the loop for its whole
#: duration (seconds here, 245 s in the attack), and every canary waited behind it.
CANARY_BUDGET_S = 2.0


async def _run_id(stack: Stack, text: str) -> str:
    start = stack.action("run_start", {"input": text})
    await stack.approve(start)
    result = await (await stack.publish(start)).result(timeout_s=20)
    assert result.status is ResultStatus.COMPLETED, result
    run_id: str = result.output["run_id"]
    return run_id


async def _canary(stack: Stack) -> float:
    began = time.monotonic()
    result = await (await stack.publish(stack.action("models"))).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED
    return time.monotonic() - began


@pytest.mark.parametrize("noise", ["blank_lines", "comments"])
async def test_endless_lines_without_an_event_end_typed_and_a_canary_finishes_on_time(
    stack: Stack, noise: str
) -> None:
    assert stack.fake is not None
    # A 4 MiB idle bound instead of 64 KiB keeps the hostile stream going for seconds, so
    # the canaries run while it is read (with the default it ends in milliseconds).
    await stack.spawn("w-hostile", AIPD_HERMES_STREAM_MAX_IDLE_BYTES=str(4 * 1024 * 1024))
    run_id = await _run_id(stack, f"hostile {noise}")
    stack.fake.faults.add(EventsNoise(run_id=run_id, noise=noise))  # type: ignore[arg-type]
    hostile = await stack.publish(stack.action("run_events", {"run_id": run_id}))
    waiting: asyncio.Task[ActionResult] = asyncio.create_task(hostile.result(timeout_s=120))
    while stack.fake.stats().count("GET /v1/runs/{run_id}/events") == 0:
        await asyncio.sleep(0.01)
    latencies = []
    while not waiting.done():
        latencies.append(await _canary(stack))
    result = await waiting
    print(
        f"\n{noise}: {len(latencies)} canaries, max {max(latencies):.3f} s, "
        f"all {[round(x, 3) for x in latencies]}"
    )
    assert latencies, "the hostile stream ended before a canary ran"
    assert max(latencies) < CANARY_BUDGET_S
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code is ErrorCode.STREAM_INCOMPLETE
    assert "without an event" in result.error.message
    assert len(await stack.results(hostile.action_id)) == 1


async def test_an_answer_too_large_to_publish_fails_typed_once_without_redelivery(
    stack: Stack,
) -> None:
    assert stack.fake is not None
    await stack.spawn("w-huge")
    run_id = await _run_id(stack, "huge answer")
    # 16 MiB of answer in 256 KiB frames: every frame and chunk fits, the answer does not.
    stack.fake.faults.add(EventsHugeAnswer(run_id=run_id, size=16 * 1024 * 1024))
    handle = await stack.publish(stack.action("run_events", {"run_id": run_id}))
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code is ErrorCode.STREAM_PUBLICATION
    assert (result.error.retryable, result.error.uncertain_outcome) == (False, True)
    assert "max_payload" in result.error.message
    await stack.settled_and_acked()
    # Twice the nak delay and more: a redelivery would have republished or re-run by now.
    await asyncio.sleep(1.5)
    assert [r.status for r in await stack.results(handle.action_id)] == [ResultStatus.FAILED]
    assert stack.fake.stats().count("GET /v1/runs/{run_id}/events") == 1
    chunks = await stack.chunks(handle.action_id)
    assert chunks[-1].kind.value == "error"
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    info = await stack.consumer()
    assert (info.num_pending, info.num_ack_pending, info.num_redelivered) == (0, 0, 0)
