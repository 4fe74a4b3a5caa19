"""`stop_tasks` ends a task even when the first cancellation is swallowed (as nats-py does
inside `_flush_pending`), and gives up after its bound instead of hanging a shutdown."""

from __future__ import annotations

import asyncio

from worker.tasks import stop_tasks


async def _swallows_cancellations(times: int, swallowed: list[int]) -> None:
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if len(swallowed) >= times:
                raise
            swallowed.append(1)


async def test_a_task_that_swallows_one_cancellation_is_cancelled_again() -> None:
    swallowed: list[int] = []
    task = asyncio.create_task(_swallows_cancellations(1, swallowed))
    await asyncio.sleep(0)
    assert await stop_tasks([task], timeout_s=2.0) is True
    assert task.cancelled()
    assert swallowed == [1]


async def test_a_task_that_never_ends_is_given_up_after_the_bound() -> None:
    swallowed: list[int] = []
    task = asyncio.create_task(_swallows_cancellations(10_000, swallowed))
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await stop_tasks([task], timeout_s=0.3) is False
    assert 0.3 <= loop.time() - started < 1.0
    assert not task.done()
    assert len(swallowed) >= 2  # cancelled again, not once
    swallowed.extend([1] * 10_000)  # let it end now
    assert await stop_tasks([task], timeout_s=1.0) is True


async def test_finished_and_failed_tasks_are_collected_without_warnings() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    done = asyncio.create_task(asyncio.sleep(0))
    failed = asyncio.create_task(fails())
    await asyncio.sleep(0.01)
    assert await stop_tasks([done, failed], timeout_s=1.0) is True
