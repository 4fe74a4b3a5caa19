"""Whether this worker's heartbeat keeps up: the second gate of every fetch.

A worker that takes more work than its CPU can serve does not fail, it falls behind: every
callback waits behind all the others in the one event loop, and so does the heartbeat's
renewal round trip. Measured in benchmark figure 4 (10,000 held runs, the worker held to
about a third of a core): renewal round trips of 3 to 21 s against a 5 s heartbeat
interval, so the 12 s a lease is trusted without a confirmed renewal (`LOCAL_VALIDITY` of a
15 s TTL) ran out, and thousands of leases were given up while their runs were fine. Each
given-up lease is redelivered and admitted again, which costs CPU exactly when there is
none, and the pull loops went on fetching new work all the while.

So the heartbeat measures itself. A renewal round trip longer than `STRAINED_SHARE` of the
heartbeat interval means the loop is swamped: this gate closes as soon as the round trip has
taken that long (`overdue`, not only when it ends), and the pull loops fetch nothing until a
round trip takes less than half that again (or no lease is held). The two bounds differ so
that a worker at the edge does not reopen on a round trip just under the limit and swamp
itself again before the next tick. Work already held goes on; new work stays on the stream
for a worker with room. Nothing here decides that a lease is lost; that stays with
`worker.execution.leases`.
"""

from __future__ import annotations

import asyncio
import logging

from worker.metrics import Metrics

log = logging.getLogger(__name__)

#: A renewal round trip longer than this share of the heartbeat interval closes the gate.
#: Half: the next tick starts one interval after this one did, so while round trips stay
#: under it a lease is confirmed at most 1.5 intervals (half the TTL) after the previous
#: confirmation, well inside the 0.8 of the TTL it is trusted for. Closing the gate does not
#: bound a round trip that goes on growing from work already held; it stops adding to it.
STRAINED_SHARE = 0.5
#: The gate opens again after a round trip shorter than this share of the closing limit.
RELIEVED_SHARE = 0.5


class HeartbeatPressure:
    """Open while the last renewal round trip was quick (or no lease was held)."""

    def __init__(self, interval_s: float, metrics: Metrics | None = None) -> None:
        #: A round trip longer than this closes the gate.
        self.limit_s = interval_s * STRAINED_SHARE
        self.metrics = metrics
        #: The round trip that closed the gate (0.0 while it is open).
        self.strained_s = 0.0
        self._open = asyncio.Event()
        self._open.set()

    @property
    def accepting(self) -> bool:
        return self._open.is_set()

    async def wait_accepting(self) -> None:
        await self._open.wait()

    def overdue(self) -> None:
        """The renewal round trip under way has taken `limit_s` already: close now."""
        self._strained(self.limit_s, "has taken")

    def measured(self, round_trip_s: float) -> None:
        """One renewal round trip of every held lease took `round_trip_s`."""
        if round_trip_s > self.limit_s:
            self._strained(round_trip_s, "took")
        elif round_trip_s <= self.limit_s * RELIEVED_SHARE:
            self.relieved()

    def _strained(self, round_trip_s: float, took: str) -> None:
        if self.accepting:
            log.warning(
                "heartbeat behind: renewing the held leases %s %.1f s (the limit is %.1f s);"
                " fetching paused until a renewal takes less than %.1f s",
                took, round_trip_s, self.limit_s, self.limit_s * RELIEVED_SHARE,
            )
        self.strained_s = max(self.strained_s, round_trip_s)
        self._open.clear()
        if self.metrics is not None:
            self.metrics.heartbeat_strained.set(1)

    def relieved(self) -> None:
        """Open the gate: a quick round trip, or nothing left to renew."""
        if not self.accepting:
            log.info("heartbeat keeps up again; fetching is on")
        self.strained_s = 0.0
        self._open.set()
        if self.metrics is not None:
            self.metrics.heartbeat_strained.set(0)
