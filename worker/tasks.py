"""Stopping background tasks within a bound, even when a library swallows the cancellation.

nats-py 2.x catches `asyncio.CancelledError` in a few places (`Client._flush_pending` and
`Client.drain`, for example) and carries on: a task cancelled while it is inside one of them
keeps running as if nothing happened. A loop that relies on one `task.cancel()` followed by
`await task` then never ends, and a gateway or worker shutdown hangs with it (seen in CI: a
gateway's recovery loop outlived its stop by minutes). `stop_tasks` is the one place that
stops a background task: it cancels again until the task ends, and gives up after a bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

#: How often a task that is still running is cancelled again.
RECANCEL_INTERVAL_S = 0.1


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], timeout_s: float) -> bool:
    """Cancel `tasks` and wait for them to end, cancelling again every 100 ms while one is
    still running; True when all ended within `timeout_s`. Their results and exceptions are
    retrieved (so none is reported as never retrieved) and otherwise ignored."""
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending:
        for task in pending:
            task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_INTERVAL_S, remaining))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()
    if pending:
        log.warning(
            "%d background task(s) still running after %.1f s: %s",
            len(pending),
            timeout_s,
            ", ".join(sorted(task.get_name() for task in pending)),
        )
    return not pending
