"""The cancel signal of one execution: an `asyncio.Event` that also calls back when set.

A stream waiting for its next provider event must stop the moment a cancel is requested
(worker/operator/observe.py). Waiting on the Event for that took a watcher task per
stream: a task, a coroutine and a waiter future for every run held, ~2 KiB each of the
10,000 runs in figure 4 of the bench. A callback registered here costs a list entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class CancelSignal(asyncio.Event):
    """Set once by the cancel path; `set` also runs the registered callbacks, once."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the signal is set (at once when it already is)."""
        if self.is_set():
            callback()
        else:
            self._callbacks.append(callback)

    def remove_callback(self, callback: Callable[[], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)
