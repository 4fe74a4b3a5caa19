"""The heartbeat: keep every lease this worker holds alive, and stop work the moment one is lost.

One pipelined round trip per tick renews all leases (cost does not grow with the number of
Actions in flight) and reports cancel intents in the same replies. A lease is lost when a
renewal says so, or when no renewal has succeeded for a whole TTL (Redis unreachable,
process paused): either way the execution is cancelled at once and settles nothing.

`lose` is also where every other detection of a loss is reported — the execution's local
validity check after a pause, a fenced binding write, a fenced settle — so each real loss
is counted (`leases_lost_total`, the metric operators alert on) and logged exactly once. A
renewal refused because the owner itself just settled or released the lease is not a loss.
"""

from __future__ import annotations

import asyncio
import logging
import time

from schemas.audit import ReceiptEvent
from worker.audit import AuditLog
from worker.cancel_notices import CancelNotices
from worker.errors import StoreUnavailable
from worker.execution import Execution
from worker.logs import RepeatedErrors
from worker.metrics import FenceStep, Metrics
from worker.store.health import StoreHealth
from worker.store.lease_store import LeaseStore

log = logging.getLogger(__name__)


class LeaseKeeper:
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
        self.executions: dict[str, Execution] = {}
        #: The same executions by Action id (an Action runs at most once per worker).
        self._by_action: dict[str, Execution] = {}
        self.lost_count = 0
        self.renew_round_trips = 0
        self.notices = CancelNotices(store, holding=self.holding, cancel=self.cancel)

    def add(self, execution: Execution) -> None:
        self.executions[execution.owner] = execution
        self._by_action[execution.action.id] = execution
        self.notices.registered(execution.action.id)

    def cancel_notice(self, action_id: str) -> None:
        """A cancel notice named `action_id`: re-read its durable intent soon (it grants
        nothing by itself; see `worker.cancel_notices`)."""
        self.notices.notice(action_id)

    def remove(self, execution: Execution) -> None:
        self.executions.pop(execution.owner, None)
        if self._by_action.get(execution.action.id) is execution:
            del self._by_action[execution.action.id]

    def holding(self, action_id: str) -> Execution | None:
        return self._by_action.get(action_id)

    async def run(self) -> None:
        """The heartbeat, and the re-reads cancel notices ask for, until cancelled."""
        notices = asyncio.get_running_loop().create_task(self.notices.run())
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                await self.tick()
        finally:
            notices.cancel()

    async def tick(self) -> None:
        held = list(self.executions.values())
        if not held:
            return
        sent_at = time.monotonic()
        try:
            renewals = await self.store.renew_many(
                [(e.keys, e.owner, e.fence) for e in held],
                self.lease_ttl_ms,
                budget_s=self.interval_s,
            )
            self.renew_round_trips += 1
        except StoreUnavailable:
            if self.metrics is not None:
                self.metrics.heartbeat(time.monotonic() - sent_at, leases=len(held), ok=False)
            self.errors.report(
                "heartbeat", "redis unavailable", log, "lease renewal failed: redis unavailable"
            )
            if self.health is not None:
                self.health.mark_failing("lease renewal failed")
            self._expire_stale(held)
            return
        if self.metrics is not None:
            self.metrics.heartbeat(time.monotonic() - sent_at, leases=len(held), ok=True)
        if self.health is not None:
            self.health.mark_answering()
        for execution, renewal in zip(held, renewals, strict=True):
            if not renewal.still_held:
                if execution.ending:
                    continue  # settled or released while this renewal was in flight
                if self.metrics is not None:
                    self.metrics.fenced_out(execution.endpoint.id, FenceStep.RENEW)
                self.lose(execution, "renewal refused: another owner holds the lease")
                continue
            execution.renewed_at = sent_at
            await execution.in_progress()
            if renewal.cancel_requested and not execution.cancel_requested.is_set():
                self.cancel(execution)

    def _expire_stale(self, held: list[Execution]) -> None:
        limit = self.lease_ttl_ms / 1000
        for execution in held:
            if execution.ending:
                # A settle (or release) is in flight: its own answer tells a real loss
                # (fenced out, settled by another owner); guessing from the clock here would
                # count a loss that the settle then disproves.
                continue
            if time.monotonic() - execution.renewed_at > limit:
                self.lose(execution, "no successful renewal for a whole lease TTL")

    def lose(self, execution: Execution, why: str, *, cancel: bool = True) -> None:
        """Report a lost lease once (metric, log line, receipt) and stop the execution;
        `cancel=False` when the caller found the loss itself and is already stopping."""
        if execution.loss_reported:
            return
        execution.loss_reported = True
        execution.lease_lost = True
        self.lost_count += 1
        if self.metrics is not None:
            self.metrics.lease_lost(execution.endpoint.id)
        log.warning(
            "lease lost for %s (fence %d): %s",
            execution.action.id,
            execution.fence,
            why,
            extra=execution.log_fields(),
        )
        self.audit.emit(
            ReceiptEvent.LEASE_LOST,
            action_id=execution.action.id,
            endpoint_id=execution.endpoint.id,
            fence=execution.fence,
            reason=why,
        )
        if cancel and execution.task is not None:
            execution.task.cancel("lease lost")

    def cancel(self, execution: Execution) -> None:
        """A durable cancel intent reached this holder (by heartbeat or by notification)."""
        execution.cancel_requested.set()
        if not execution.operation.handles_cancel and execution.task is not None:
            execution.task.cancel("cancel requested")
