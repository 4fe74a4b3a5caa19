"""The heartbeat's backstop: the held leases renewed from a thread of its own while the
event loop is too swamped to renew them in time.

The heartbeat (`LeaseKeeper`) renews on the event loop, so its round trip waits behind every
ready callback of the loop, twice (to send, and to read the reply). On a worker held to 15 %
of a core with 10,000 runs in flight (benchmark figure 4, `--starve 0.15`), one round trip
took longer than the 12 s a lease is trusted for, and every lease was given up at once while
the runs were fine (BENCHMARKS.md, "An overloaded worker keeps its leases"). Closing the fetch
gate (`HeartbeatPressure`) stops such a worker taking more work; it cannot make the loop any
faster for the work it already holds.

This thread wakes every `CHECK_SHARE` of the heartbeat interval. While the heartbeat keeps up
(its last answered renewal was sent less than `BEHIND_SHARE` of the TTL ago, the bound the
pressure gate holds it to) it sends nothing. Otherwise it renews every held lease itself, at
most once per interval, over a Redis client and an event loop of its own: a thread waiting
for the GIL gets it within the interpreter's switch interval (5 ms), however long the main
loop's backlog is.

It renews only while the main loop shows progress, and at most once per pass of it: a pulse
it posts there must have run since the thread's previous renewal, and within one TTL. So a
loop that runs nothing (a call that blocks it, or one that never returns) gets one renewal
from the thread at most, and its leases then run out for other workers to take the Actions
over, as they would without this thread. A paused process (SIGSTOP, a frozen VM) pauses
this thread too; the local validity check (`HeldLease.check`) is unchanged.

What it finds goes back to the keeper. A confirmed renewal moves the lease's `renewed_at`
forward, never back (`HeldLease.confirmed`). A refusal and a cancel intent are handed to the
main loop (`LeaseKeeper.refused`, `LeaseKeeper.cancel_intent`), where every loss is reported,
once. The heartbeat itself is unchanged: it still renews, tells JetStream the deliveries are
in progress, and measures the pressure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from worker.execution.leases import Leased, LeaseKeeper
from worker.metrics import Metrics
from worker.store.lease_store import LeaseStore, Renewal

log = logging.getLogger(__name__)

#: The thread looks at the heartbeat this often, as a share of the heartbeat interval.
CHECK_SHARE = 0.2
#: The heartbeat is behind once its last answered renewal was sent this share of the TTL
#: ago: 1.5 intervals, the most a keeping-up heartbeat leaves between two confirmations.
BEHIND_SHARE = 0.5


class RenewalBackstop:
    """Renews `keeper`'s leases from a thread while the heartbeat is behind; `open_client`
    makes the thread's own Redis client (called on the thread, inside its event loop)."""

    def __init__(
        self,
        keeper: LeaseKeeper[Any],
        open_client: Callable[[], Redis | RedisCluster],
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self.keeper = keeper
        self.open_client = open_client
        self.metrics = metrics
        self.ttl_ms = keeper.lease_ttl_ms
        self.interval_s = keeper.interval_s
        self.check_s = self.interval_s * CHECK_SHARE
        self.behind_after_s = self.ttl_ms / 1000 * BEHIND_SHARE
        #: The main loop is alive while its last pulse ran within this long.
        self.alive_within_s = self.ttl_ms / 1000
        #: Renewal round trips this thread sent, and how many Redis answered.
        self.rounds = 0
        self.rounds_answered = 0
        self._main: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._own: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        #: Monotonic time of the last pulse the main loop ran, and whether one is posted.
        self._pulse_at = time.monotonic()
        self._pulse_posted = False
        self._sent_at = 0.0
        #: What the thread last said, so that a state is logged once, not once per check.
        self._said = ""

    def start(self) -> None:
        """Start the thread (on the main loop, which it reports back to)."""
        if self._thread is not None:
            return
        self._main = asyncio.get_running_loop()
        self._pulse_at = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name="lease-renewal-backstop", daemon=True
        )
        self._thread.start()

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and close its client; waits up to `timeout_s` (a renewal in
        flight is bounded by the heartbeat interval)."""
        self._stopping = True
        thread, own, wake = self._thread, self._own, self._wake
        if thread is None:
            return
        if own is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed
                own.call_soon_threadsafe(wake.set)
        await asyncio.get_running_loop().run_in_executor(None, thread.join, timeout_s)
        if thread.is_alive():
            log.warning("lease renewal backstop did not stop within %.0f s", timeout_s)

    # --- on the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve())
        except Exception:  # the thread ends; the heartbeat goes on as it always did
            log.exception("lease renewal backstop stopped")
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._own = asyncio.get_running_loop()
        wake = self._wake = asyncio.Event()
        client = self.open_client()
        store = LeaseStore(client, call_budget_s=self.interval_s)
        try:
            while not self._stopping:
                self._post_pulse()
                if self._due():
                    await self._renew(store)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.check_s)
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()

    def _post_pulse(self) -> None:
        """Ask the main loop to show it runs callbacks (one pulse in flight at a time)."""
        main = self._main
        if self._pulse_posted or main is None:
            return
        self._pulse_posted = True
        with contextlib.suppress(RuntimeError):  # the main loop closed: nothing to keep
            main.call_soon_threadsafe(self._pulse)

    def _pulse(self) -> None:  # on the main loop
        self._pulse_at = time.monotonic()
        self._pulse_posted = False

    def _due(self) -> bool:
        """Whether to renew now: the heartbeat is behind, the main loop still makes
        progress, and this thread's last renewal is an interval old."""
        now = time.monotonic()
        if now - self.keeper.confirmed_at <= self.behind_after_s:
            self._say("", "lease renewal backstop: the heartbeat keeps up again")
            return False
        if now - self._pulse_at > self.alive_within_s:
            self._say(
                "stuck",
                "lease renewal backstop: the event loop ran no callback for %.0f s; "
                "renewing nothing (the leases run out and other workers take over)",
                now - self._pulse_at,
                level=logging.ERROR,
            )
            return False
        if self._pulse_at <= self._sent_at:
            return False  # no pass of the loop since this thread's last renewal: wait for one
        return now - self._sent_at >= self.interval_s

    async def _renew(self, store: LeaseStore) -> None:
        held: list[Leased] = [
            e
            for e in list(self.keeper.executions.values())  # one C-level copy under the GIL
            if e.lease.lost is None and not e.lease.ending
        ]
        if not held:
            return
        sent_at = self._sent_at = time.monotonic()
        behind_s = sent_at - self.keeper.confirmed_at
        self.rounds += 1
        try:
            renewals = await self.keeper.renew_on(store, held)
        except Exception as exc:  # nothing confirmed: the leases run out by the clock
            self._count("failed")
            # Once per failing spell (Redis down fails the heartbeat too, which reports it).
            self._say("failing", "lease renewal backstop: renewal failed (%s)", type(exc).__name__)
            return
        self.rounds_answered += 1
        self._count("ok")
        self._say(
            "behind",
            "lease renewal backstop: the heartbeat's last answered renewal was sent %.1f s "
            "ago; renewed the %d held lease(s) from its thread",
            behind_s,
            len(held),
        )
        self._report(held, renewals, sent_at)

    def _report(self, held: list[Leased], renewals: list[Renewal], sent_at: float) -> None:
        refused: list[Leased] = []
        cancelled: list[Leased] = []
        for execution, renewal in zip(held, renewals, strict=True):
            if not renewal.still_held:
                refused.append(execution)
                continue
            execution.lease.confirmed(sent_at)
            if renewal.cancel_requested:
                cancelled.append(execution)
        if (refused or cancelled) and self._main is not None:
            with contextlib.suppress(RuntimeError):
                self._main.call_soon_threadsafe(self._hand_back, refused, cancelled)

    def _hand_back(self, refused: list[Leased], cancelled: list[Leased]) -> None:  # main loop
        for execution in refused:
            self.keeper.refused(execution)
        for execution in cancelled:
            self.keeper.cancel_intent(execution)

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.backstop_renewal(outcome)

    def _say(self, state: str, message: str, *args: object, level: int = logging.WARNING) -> None:
        """Log `message` when the thread enters `state` ('' is the quiet one)."""
        if state == self._said:
            return
        was, self._said = self._said, state
        if state or was:
            log.log(level if state else logging.INFO, message, *args)
