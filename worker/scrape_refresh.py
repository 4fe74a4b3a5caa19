"""A gauge counted from durable state when `/metrics` is scraped, at most once per interval.

Gauges that must tell the truth across a pool (open escalations, queue depth) are counted
from NATS and Redis rather than kept in one process's memory. Counting costs requests, so
a refresh runs when a scrape asks for one, at most once per `min_interval_s`; concurrent
scrapes share it, and a scrape waits for it at most `SCRAPE_WAIT_S` (then shows the previous
values). One place decides that, for every such gauge.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from worker.tasks import stop_tasks

log = logging.getLogger(__name__)

#: How long a scrape waits for a refresh before it shows the previous value.
SCRAPE_WAIT_S = 5.0


class RefreshedOnScrape:
    """Runs `refresh` for a scrape, throttled and shared (see the module docstring)."""

    def __init__(
        self,
        name: str,
        refresh: Callable[[], Coroutine[Any, Any, None]],
        *,
        min_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._refresh = refresh
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._last: float | None = None
        self._running: asyncio.Task[None] | None = None

    async def before_scrape(self) -> None:
        """Refresh unless one ran within `min_interval_s`; never raises, waits boundedly."""
        if self._running is None:
            if self._last is not None and self._clock() - self._last < self.min_interval_s:
                return
            self._running = asyncio.get_running_loop().create_task(self._refresh())
            self._running.add_done_callback(self._done)
        try:
            await asyncio.wait_for(asyncio.shield(self._running), SCRAPE_WAIT_S)
        except TimeoutError:
            log.info("%s refresh still running; the scrape shows the last value", self.name)

    async def stop(self) -> None:
        """Cancel a refresh still running (shutdown)."""
        if self._running is not None:
            await stop_tasks([self._running], SCRAPE_WAIT_S)

    def _done(self, _: asyncio.Task[None]) -> None:
        self._running = None
        self._last = self._clock()


def before_every_scrape(
    refreshers: Sequence[RefreshedOnScrape],
) -> Callable[[], Awaitable[None]]:
    """One `before_scrape` hook that runs every refresher concurrently."""

    async def before_scrape() -> None:
        await asyncio.gather(*(refresher.before_scrape() for refresher in refreshers))

    return before_scrape
