"""The execution's cancel signal (worker/execution/cancel_signal.py): what `asyncio.Event` offered
(set once, awaited), plus callbacks run once by `set` and never after removal."""

from __future__ import annotations

import asyncio

from worker.execution.cancel_signal import CancelSignal


async def test_waiters_wake_and_callbacks_run_once_when_set() -> None:
    signal = CancelSignal()
    seen: list[str] = []
    signal.add_callback(lambda: seen.append("a"))
    removed = lambda: seen.append("removed")  # noqa: E731 - a distinct callable to remove
    signal.add_callback(removed)
    signal.remove_callback(removed)
    waiter = asyncio.ensure_future(signal.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    assert not signal.is_set()
    signal.set()
    signal.set()
    assert await waiter is True
    assert seen == ["a"]
    signal.add_callback(lambda: seen.append("late"))  # already set: runs at once
    assert seen == ["a", "late"]
    assert await signal.wait() is True


async def test_a_cancelled_wait_leaves_no_callback_behind() -> None:
    signal = CancelSignal()
    waiter = asyncio.ensure_future(signal.wait())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert signal._callbacks == []
    signal.set()
    assert signal.is_set()
