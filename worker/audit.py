"""Audit receipts: one redacted record per decision a worker takes about an Action."""

from __future__ import annotations

import asyncio
import itertools
import time

from schemas.audit import DetailValue, Receipt, ReceiptEvent
from worker.publisher import BusPublisher


class AuditLog:
    """Emits receipts without ever blocking or failing the delivery that produced them."""

    def __init__(self, publisher: BusPublisher | None, worker_id: str) -> None:
        self.publisher = publisher
        self.worker_id = worker_id
        self._counter = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()

    def emit(
        self,
        event: ReceiptEvent,
        *,
        action_id: str,
        endpoint_id: str,
        fence: int = 0,
        trace_id: str | None = None,
        **details: DetailValue,
    ) -> None:
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
            details=dict(details),
        )
        task = asyncio.get_running_loop().create_task(self.publisher.receipt(receipt))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float = 2.0) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout_s)
