"""The per-run event buffer behind `GET /v1/runs/{id}/events`.

Hermes puts every run event into a queue from the moment the run is created, and the SSE
handler pops from it. That single design explains the observed quirks the fake copies: a
late first subscriber still gets everything, two concurrent subscribers split the events, and
once the first subscriber is gone the queue is dropped (the next GET is a 404).
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any


class Signal(enum.Enum):
    """What `EventChannel.get` returns instead of an event."""

    #: Nothing arrived within the timeout (time for `: keepalive`).
    IDLE = "idle"
    #: The run finished and every event was taken, or the channel was dropped.
    END = "end"


class EventChannel:
    """An asyncio queue of event payloads with one producer and any number of readers.

    Readers are served first come, first served (asyncio.Queue), which is what splits the
    events between concurrent subscribers the way Hermes does.
    """

    def __init__(self, created_at: float) -> None:
        self.created_at = created_at
        self.subscribed = False
        self._queue: asyncio.Queue[dict[str, Any] | Signal] = asyncio.Queue()
        self._dropped = False

    def put(self, payload: dict[str, Any]) -> None:
        """Buffer one event (ignored once the channel was dropped)."""
        if not self._dropped:
            self._queue.put_nowait(payload)

    def finish(self) -> None:
        """The producer is done: readers get END after the buffered events."""
        self._queue.put_nowait(Signal.END)

    def drop(self) -> None:
        """Discard the buffer and end every reader now (consumed, swept, or restart)."""
        self._dropped = True
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(Signal.END)

    @property
    def dropped(self) -> bool:
        """True once the channel can no longer be subscribed."""
        return self._dropped

    async def get(self, idle_s: float) -> dict[str, Any] | Signal:
        """The next event, `Signal.IDLE` after `idle_s` seconds of nothing, or `Signal.END`."""
        if self._dropped:
            return Signal.END
        try:
            item = await asyncio.wait_for(self._queue.get(), idle_s)
        except TimeoutError:
            return Signal.END if self._dropped else Signal.IDLE
        if item is Signal.END:
            self._queue.put_nowait(Signal.END)  # every other reader ends too
        return item
