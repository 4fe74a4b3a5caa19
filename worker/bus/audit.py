"""Audit receipts: one redacted record per decision a worker takes about an Action."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass

from schemas.audit import DetailValue, Receipt, ReceiptEvent
from worker.bus.publisher import BusPublisher
from worker.hermes.exchange import Exchange

log = logging.getLogger(__name__)


class AuditLog:
    """Emits receipts without ever blocking or failing the delivery that produced them.

    Receipts wait in a queue that one sender task empties (started on demand, ending when
    the queue is empty), in the order they were emitted: a task per receipt cost more CPU
    than publishing the receipt itself. A receipt that cannot be sent is logged and skipped;
    it never ends the sender, so it never costs the receipts queued behind it.
    """

    def __init__(self, publisher: BusPublisher | None, worker_id: str) -> None:
        self.publisher = publisher
        self.worker_id = worker_id
        self._counter = itertools.count()
        self._queue: deque[Receipt] = deque()
        self._sender: asyncio.Task[None] | None = None

    def emit(
        self,
        event: ReceiptEvent,
        *,
        action_id: str,
        endpoint_id: str,
        fence: int = 0,
        trace_id: str | None = None,
        facts: Mapping[str, DetailValue] | None = None,
        **details: DetailValue,
    ) -> None:
        """Queue one receipt; `facts` and `details` together are its redacted details."""
        if self.publisher is None:
            return
        n = next(self._counter)
        receipt = Receipt(
            receipt_id=f"{action_id}:{event.value}:{fence}:{self.worker_id}:{n}",
            event=event,
            action_id=action_id,
            endpoint_id=endpoint_id,
            worker_id=self.worker_id,
            fence=fence,
            trace_id=trace_id,
            ts_unix_ms=time.time_ns() // 1_000_000,
            details={**facts, **details} if facts else dict(details),
        )
        self._queue.append(receipt)
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send(self.publisher))

    async def _send(self, publisher: BusPublisher) -> None:
        queue = self._queue
        try:
            while queue:
                receipt = queue.popleft()
                try:
                    await publisher.receipt(receipt)
                except Exception as exc:
                    log.warning(
                        "audit receipt %s of %r not sent: %s",
                        receipt.event.value,
                        receipt.action_id[:80],
                        type(exc).__name__,
                    )
        finally:
            self._sender = None

    async def drain(self, timeout_s: float = 2.0) -> None:
        sender = self._sender
        if sender is not None:
            await asyncio.wait([sender], timeout=timeout_s)


@dataclass(frozen=True, slots=True)
class ReceiptScope:
    """The Action an execution task works on, so deep code can leave receipts for it."""

    log: AuditLog
    action_id: str
    endpoint_id: str
    fence: int
    trace_id: str | None


_scope: ContextVar[ReceiptScope | None] = ContextVar("aip_receipt_scope", default=None)


def enter_scope(scope: ReceiptScope) -> None:
    """Bind receipts to `scope` for the current task (each execution runs in its own task,
    so its context copy carries the scope and nothing else sees it)."""
    _scope.set(scope)


def receipt(event: ReceiptEvent, **details: DetailValue) -> None:
    """Record a decision about the Action the current task executes (no-op outside one).

    The operator calls this, and the HTTP client through `provider_receipt`, without
    knowing which Action they serve.
    """
    scope = _scope.get()
    if scope is not None:
        scope.log.emit(
            event,
            action_id=scope.action_id,
            endpoint_id=scope.endpoint_id,
            fence=scope.fence,
            trace_id=scope.trace_id,
            facts=details,
        )


def provider_receipt(exchange: Exchange) -> None:
    """The `provider_request` receipt of one finished Hermes exchange: the hook the app wires
    into every `HermesClient`. Method, route template, status and duration only: never a
    body or a header value."""
    receipt(
        ReceiptEvent.PROVIDER_REQUEST,
        method=exchange.method,
        route=exchange.route,
        status=exchange.status,
        duration_ms=round(exchange.seconds * 1000, 1),
    )
