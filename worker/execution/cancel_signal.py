"""The cancel signal of one execution: set once, awaited or called back.

A stream waiting for its next provider event must stop the moment a cancel is requested
(worker/operator/observe.py). Waiting on an `asyncio.Event` for that took a watcher task per
stream (a task, a coroutine and a waiter future), and each Event allocates its waiters'
deque up front: ~2.5 KiB for every run held, in figure 4 of the bench (10,000 runs). Here a
callback is a list entry, made only when registered, and a waiter a future made only while
someone waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class CancelSignal:
    """`asyncio.Event`'s `set`/`is_set`/`wait`, plus callbacks that `set` runs once."""

    __slots__ = ("_callbacks", "_set")

    def __init__(self) -> None:
        self._set = False
        self._callbacks: list[Callable[[], None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback()

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the signal is set (at once when it already is)."""
        if self._set:
            callback()
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)

    def remove_callback(self, callback: Callable[[], None]) -> None:
        if self._callbacks is not None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(callback)

    async def wait(self) -> bool:
        """Until the signal is set (True, like `asyncio.Event.wait`)."""
        if self._set:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        self.add_callback(wake)
        try:
            await waiter
        finally:
            self.remove_callback(wake)
        return True
