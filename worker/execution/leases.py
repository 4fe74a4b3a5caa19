"""The leases this worker holds: each one's validity and loss, and the heartbeat over all.

A `HeldLease` is one lease's fence facts and its local validity check: before anything is
published or an unsafe request sent, `check` stops a worker whose last confirmed renewal is
older than 80 % of the TTL (a pause: SIGSTOP, a long GC, a frozen VM), because by then the
lease may belong to someone else.

A loss has one form, `LeaseLost`, whoever finds it: the local check, a renewal refused, no
renewal for a whole TTL, a fenced script (the unsafe-attempt mark, a binding write, the
settle). The heartbeat records its findings on the lease and cancels the execution; the
runtime turns that cancellation into the same `LeaseLost`, and stops without settling,
publishing or acking.

The heartbeat (`LeaseKeeper`) renews all leases in one pipelined round trip per tick (cost
does not grow with the number of Actions in flight) and reports cancel intents in the same
replies. Ticks start one interval apart, and each round trip is timed: a slow one (a
swamped event loop) closes the pull loops' fetch gate (`HeartbeatPressure`), so an
overloaded worker keeps the leases it holds before it takes more work.

`lose` is where every loss is reported, once (`leases_lost_total`, the metric operators
alert on, a log line and a receipt). A renewal refused because the owner itself just
settled or released the lease is not a loss.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

from schemas.action import Action
from schemas.audit import ReceiptEvent
from worker.bus.audit import AuditLog
from worker.bus.consumer import admitted
from worker.endpoints import Endpoint
from worker.errors import LeaseLost, StoreUnavailable
from worker.execution.cancel_notices import CancelNotices
from worker.execution.cancel_signal import CancelSignal
from worker.execution.heartbeat_pressure import HeartbeatPressure
from worker.logs import RepeatedErrors
from worker.metrics import FenceStep, Metrics
from worker.operations.base import Operation
from worker.store.health import StoreHealth
from worker.store.keys import ActionKeys
from worker.store.lease_store import LeaseGrant, LeaseStore, Renewal

log = logging.getLogger(__name__)

#: Share of the lease TTL after the last confirmed renewal during which this worker still
#: trusts it holds the lease. The margin covers clock-rate drift and the renewal round trip.
LOCAL_VALIDITY = 0.8


class HeldLease:
    """One lease this worker holds: the grant's facts, the last confirmed renewal, and
    whether (and why) it was lost."""

    def __init__(self, keys: ActionKeys, owner: str, grant: LeaseGrant, *, ttl_ms: int) -> None:
        self.keys = keys
        #: Unique per delivery attempt: the owner token every fenced script checks.
        self.owner = owner
        self.fence = grant.fence
        #: True when this delivery took the Action over from an earlier owner.
        self.is_takeover = grant.is_takeover
        #: Fence of an earlier owner that recorded sending an unsafe request (0: none did).
        self.attempted_fence = grant.attempted_fence
        #: Redis time at which this delivery acquired the lease (0: unknown).
        self.leased_at_ms = grant.now_ms
        #: This delivery's chunk-chain key, kept under its fence in the lease hash: the MAC
        #: on each of its chunks (`worker.execution.chunk_chain`; '' sends none).
        self.chain_key = grant.chain_key
        self._ttl_s = ttl_ms / 1000
        #: Monotonic time at which the last *successful* renewal was sent (acquire counts).
        self.renewed_at = time.monotonic()
        #: Why the lease was lost (None while it is held).
        self.lost: str | None = None
        #: The keeper counted and logged the loss (once, whichever check found it first).
        self.loss_reported = False
        #: The owner is settling or releasing the lease: from now on a renewal refused is
        #: that, not a loss (the settle's own answer tells a real one).
        self.ending = False
        #: Given back unsettled (shutdown): not a loss, nothing is reported.
        self.released = False

    def confirmed(self, sent_at: float) -> None:
        """A renewal sent at `sent_at` (monotonic) was answered: the lease is ours until
        at least then plus the TTL. Moves `renewed_at` forward only: the heartbeat and the
        backstop thread both confirm, and a slow round trip's answer must not undo a
        newer one."""
        if sent_at > self.renewed_at:
            self.renewed_at = sent_at

    def lose(self, why: str) -> LeaseLost:
        """Record the loss (the first reason stays) and return what to raise."""
        if self.lost is None:
            self.lost = why
        return LeaseLost(self.lost)

    def check(self) -> None:
        """Raise LeaseLost unless a renewal confirmed the lease recently enough: the check
        before every publish and every unsafe provider request.

        A worker paused past its TTL resumes here with a stale `renewed_at` and stops before
        it publishes or sends anything.
        """
        if self.lost is not None:
            raise LeaseLost(self.lost)
        if time.monotonic() - self.renewed_at > self._ttl_s * LOCAL_VALIDITY:
            raise self.lose("lease not confirmed within its TTL")


class Leased(Protocol):
    """What the heartbeat needs of an execution it keeps (`worker.execution.context.Execution`
    is one): a protocol, so that this module does not import the executions' own, which
    imports it."""

    @property
    def lease(self) -> HeldLease: ...

    @property
    def keys(self) -> ActionKeys: ...

    @property
    def action(self) -> Action: ...

    @property
    def endpoint(self) -> Endpoint: ...

    @property
    def operation(self) -> Operation: ...

    @property
    def cancel_requested(self) -> CancelSignal: ...

    @property
    def task(self) -> asyncio.Task[Any] | None: ...

    def log_fields(self) -> dict[str, object]: ...

    async def in_progress(self) -> None: ...


L = TypeVar("L", bound=Leased)


class LeaseKeeper(Generic[L]):
    """The heartbeat over the executions this worker runs, and the one place a loss is
    reported; it hands back the executions it was given, of whatever type they are."""

    def __init__(
        self,
        store: LeaseStore,
        audit: AuditLog,
        *,
        lease_ttl_ms: int,
        metrics: Metrics | None = None,
        health: StoreHealth | None = None,
        errors: RepeatedErrors | None = None,
    ) -> None:
        self.store = store
        #: Told of every renewal's result: a failing heartbeat closes the fetch gate.
        self.health = health
        self.errors = errors if errors is not None else RepeatedErrors()
        self.metrics = metrics
        self.audit = audit
        self.lease_ttl_ms = lease_ttl_ms
        self.interval_s = lease_ttl_ms / 3000
        self.executions: dict[str, L] = {}
        #: The same executions by Action id (an Action runs at most once per worker).
        self._by_action: dict[str, L] = {}
        self.lost_count = 0
        self.renew_round_trips = 0
        #: Monotonic time at which the last tick whose renewals Redis answered was sent (or
        #: found nothing to renew): how far behind the heartbeat is (`RenewalBackstop`).
        self.confirmed_at = time.monotonic()
        self.notices: CancelNotices[L] = CancelNotices(
            store, holding=self.holding, cancel=self.cancel
        )
        #: Closed while renewals are slow (an overloaded worker): the pull loops' second
        #: gate, so a worker that cannot keep its leases takes no more work.
        self.pressure = HeartbeatPressure(self.interval_s, metrics)

    def add(self, execution: L) -> None:
        """Heartbeat `execution` from now on. Called in the task of its delivery, which
        from here on is kept alive by the heartbeat's in-progress signals: its place in
        the pull loop's admission window goes to the next fetch (`admitted`)."""
        self.executions[execution.lease.owner] = execution
        self._by_action[execution.action.id] = execution
        self.notices.registered(execution.action.id)
        admitted()

    def cancel_notice(self, action_id: str) -> None:
        """A cancel notice named `action_id`: re-read its durable intent soon (it grants
        nothing by itself; see `worker.execution.cancel_notices`)."""
        self.notices.notice(action_id)

    def remove(self, execution: L) -> None:
        self.executions.pop(execution.lease.owner, None)
        if self._by_action.get(execution.action.id) is execution:
            del self._by_action[execution.action.id]

    def holding(self, action_id: str) -> L | None:
        return self._by_action.get(action_id)

    async def run(self) -> None:
        """The heartbeat, and the re-reads cancel notices ask for, until cancelled.

        Ticks start one interval apart, however long each took: a slow round trip must not
        also push the next one back (sleeping a whole interval after each tick let the gap
        between two confirmations grow to the interval plus the round trip plus the loop's
        backlog, past the 0.8 of the TTL a lease is trusted for). A tick that overran is
        followed at once.
        """
        notices = asyncio.get_running_loop().create_task(self.notices.run())
        # Behind from now on, not from construction: start-up before the first tick is not
        # a heartbeat falling behind.
        self.confirmed_at = time.monotonic()
        try:
            next_at = time.monotonic() + self.interval_s
            while True:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                next_at = time.monotonic() + self.interval_s
                try:
                    await self.tick()
                except Exception as exc:
                    # Nothing restarts a heartbeat that ended: every lease would run out
                    # while the executions went on, and a fetch gate this keeper closed
                    # would stay closed. One tick's failure is reported; the next one runs.
                    self.errors.report(
                        "heartbeat", type(exc).__name__, log,
                        "heartbeat tick failed (%s); the next runs on schedule",
                        type(exc).__name__, level=logging.ERROR, exc_info=True,
                    )  # fmt: skip
        finally:
            notices.cancel()

    async def tick(self) -> None:
        held = list(self.executions.values())
        if not held:
            self.confirmed_at = time.monotonic()
            self.pressure.relieved()
            return
        sent_at = time.monotonic()
        overdue = asyncio.get_running_loop().call_later(
            self.pressure.limit_s, self.pressure.overdue
        )
        try:
            renewals = await self.renew_on(self.store, held)
            self.renew_round_trips += 1
        except Exception as exc:
            # Unreachable, or a refusal `reask` does not ask again (an ACL or password
            # changed under the worker, a key of the wrong type): either way nothing was
            # confirmed, and the leases run out by the clock below.
            cause = "redis unavailable" if isinstance(exc, StoreUnavailable) else type(exc).__name__
            if self.metrics is not None:
                self.metrics.heartbeat(time.monotonic() - sent_at, leases=len(held), ok=False)
            self.errors.report("heartbeat", cause, log, "lease renewal failed: %s", cause)
            if self.health is not None:
                self.health.mark_failing("lease renewal failed")
            self._expire_stale(held)
            return
        finally:
            overdue.cancel()
        round_trip_s = time.monotonic() - sent_at
        self.confirmed_at = sent_at
        if self.metrics is not None:
            self.metrics.heartbeat(round_trip_s, leases=len(held), ok=True)
        self.pressure.measured(round_trip_s)
        if self.health is not None:
            self.health.mark_answering()
        for execution, renewal in zip(held, renewals, strict=True):
            if not renewal.still_held:
                self.refused(execution)
                continue
            execution.lease.confirmed(sent_at)
            await execution.in_progress()
            if renewal.cancel_requested:
                self.cancel_intent(execution)

    async def renew_on(self, store: LeaseStore, held: Sequence[Leased]) -> list[Renewal]:
        """Renew `held`'s leases over `store` in one pipelined round trip, each under its
        owner token and fence, for one TTL, within one heartbeat interval: the renewal the
        heartbeat sends and the backstop thread (on its own store) sends too."""
        return await store.renew_many(
            [(e.lease.keys, e.lease.owner, e.lease.fence) for e in held],
            self.lease_ttl_ms,
            budget_s=self.interval_s,
        )

    def refused(self, execution: L) -> None:
        """A renewal of `execution`'s lease was refused, by this heartbeat or by the
        backstop thread (`RenewalBackstop`, which hands it here on the event loop)."""
        if execution.lease.ending or self.executions.get(execution.lease.owner) is not execution:
            return  # settled or released while the renewal was in flight
        if self.metrics is not None:
            self.metrics.fenced_out(execution.endpoint.id, FenceStep.RENEW)
        self.lose(execution, "renewal refused: another owner holds the lease")

    def cancel_intent(self, execution: L) -> None:
        """A renewal's reply named a durable cancel intent for `execution`'s Action."""
        if self.executions.get(execution.lease.owner) is not execution:
            return  # finished while the renewal was in flight
        if not execution.cancel_requested.is_set():
            self.cancel(execution)

    def _expire_stale(self, held: list[L]) -> None:
        limit = self.lease_ttl_ms / 1000
        for execution in held:
            if execution.lease.ending:
                # A settle (or release) is in flight: its own answer tells a real loss
                # (fenced out, settled by another owner); guessing from the clock here would
                # count a loss that the settle then disproves.
                continue
            if time.monotonic() - execution.lease.renewed_at > limit:
                self.lose(execution, "no successful renewal for a whole lease TTL")

    def lose(self, execution: L, why: str, *, cancel: bool = True) -> None:
        """Record the loss on the execution's lease, report it once (metric, log line,
        receipt) and stop the execution; `cancel=False` when the caller found the loss
        itself and is already stopping. A lease given back at shutdown is not reported."""
        lease = execution.lease
        lease.lose(why)
        if lease.loss_reported or lease.released:
            return
        lease.loss_reported = True
        self.lost_count += 1
        if self.metrics is not None:
            self.metrics.lease_lost(execution.endpoint.id)
        log.warning(
            "lease lost for %s (fence %d): %s",
            execution.action.id,
            lease.fence,
            lease.lost,
            extra=execution.log_fields(),
        )
        self.audit.emit(
            ReceiptEvent.LEASE_LOST,
            action_id=execution.action.id,
            endpoint_id=execution.endpoint.id,
            fence=lease.fence,
            reason=lease.lost,
        )
        if cancel and execution.task is not None:
            # The runtime turns this cancellation into the lease's LeaseLost.
            execution.task.cancel()

    def cancel(self, execution: L) -> None:
        """A durable cancel intent reached this holder (by heartbeat or by notification)."""
        execution.cancel_requested.set()
        if not execution.operation.handles_cancel and execution.task is not None:
            execution.task.cancel("cancel requested")
