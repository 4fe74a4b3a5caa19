"""Audit receipts: one redacted record per decision a worker takes about an Action.

Receipts are signed in segments, because an Ed25519 signature per receipt (~22 µs, and an
operator Action leaves ~8 receipts) would cost the hot path ~13 % of its 1.38 ms of CPU per
Action (`python -m tests.bench.receipt_signing`). The receipts this process sends about one
Action within `SEAL_AFTER_S` of each other form a segment: each names the sha256 of the one
before it (`prev_sha256`), and the segment's last receipt is held until no next one came for
`SEAL_AFTER_S`, then sent signed. `audit` believes a receipt that a trusted worker signed or
that a signed receipt links back to. The price: a segment's last receipt reaches the stream
up to `SEAL_AFTER_S` later, and a process killed inside a segment loses its held receipt,
which leaves the receipts it sent of that segment unverified (reported, never believed).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

import msgspec

from schemas.audit import DetailValue, Receipt, ReceiptEvent
from schemas.codec import encode
from worker.bus.publisher import BusPublisher

log = logging.getLogger(__name__)

#: How long the last receipt of an Action's segment waits for a next one before it is sent
#: signed: receipts emitted together (an Action's start, its settle and release) share one
#: signature. It bounds how late a receipt arrives and what a kill -9 takes with it.
SEAL_AFTER_S = 0.1


@dataclass(slots=True)
class _Held:
    """The last receipt of an open segment, encoded (its hash is the next one's link)."""

    receipt: Receipt
    payload: bytes
    due: float


class AuditLog:
    """Emits receipts without ever blocking or failing the delivery that produced them.

    Receipts wait in a queue that one sender task empties (started on demand, ending when
    nothing is queued or held), in the order they were emitted: a task per receipt cost more
    CPU than publishing the receipt itself. With a signer, the sender links each receipt to
    the one it holds for the same Action (sending that one unsigned) and holds the new one;
    held receipts are sent signed once `SEAL_AFTER_S` passed (at once on `drain`). A receipt
    that cannot be sent is logged and skipped; it never ends the sender, so it never costs
    the receipts queued behind it.
    """

    def __init__(self, publisher: BusPublisher | None, worker_id: str) -> None:
        self.publisher = publisher
        self.worker_id = worker_id
        self._counter = itertools.count()
        self._queue: deque[Receipt] = deque()
        self._sender: asyncio.Task[None] | None = None
        #: Each Action's open segment, in the order they fall due (a re-held one moves last).
        self._held: dict[str, _Held] = {}
        #: Set by `drain`: held receipts are sent at once.
        self._closing = False

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
        queue, held = self._queue, self._held
        loop = asyncio.get_running_loop()
        try:
            while queue or held:
                while queue:
                    receipt = queue.popleft()
                    if publisher.signer is None:  # nothing is signed, so nothing is linked
                        await _guarded(publisher.receipt(receipt, sign=False), receipt)
                    else:
                        await self._link(publisher, receipt, loop.time() + SEAL_AFTER_S)
                if not held:
                    break
                first = next(iter(held.values()))
                if not self._closing and first.due > loop.time():
                    await asyncio.sleep(first.due - loop.time())
                now = loop.time()
                while held:
                    action_id, oldest = next(iter(held.items()))
                    if not self._closing and oldest.due > now:
                        break
                    del held[action_id]
                    await _guarded(
                        publisher.receipt(oldest.receipt, oldest.payload, sign=True),
                        oldest.receipt,
                    )
        finally:
            self._sender = None

    async def _link(self, publisher: BusPublisher, receipt: Receipt, due: float) -> None:
        """Send the receipt held for the same Action unsigned, and hold `receipt`, linked."""
        before = self._held.pop(receipt.action_id, None)
        if before is not None:
            # Linked before it is sent: a receipt lost here breaks the chain visibly (audit
            # reports the receipts before it unverified) instead of silently.
            receipt = msgspec.structs.replace(
                receipt, prev_sha256=hashlib.sha256(before.payload).hexdigest()
            )
            sending = publisher.receipt(before.receipt, before.payload, sign=False)
            await _guarded(sending, before.receipt)
        self._held[receipt.action_id] = _Held(receipt, encode(receipt), due)

    async def drain(self, timeout_s: float = 2.0) -> None:
        """Send what is queued and held (held receipts signed at once), for up to `timeout_s`."""
        self._closing = True
        sender = self._sender
        if sender is not None:
            await asyncio.wait([sender], timeout=timeout_s)


async def _guarded(sending: Awaitable[None], receipt: Receipt) -> None:
    try:
        await sending
    except Exception as exc:
        log.warning(
            "audit receipt %s of %r not sent: %s",
            receipt.event.value,
            receipt.action_id[:80],
            type(exc).__name__,
        )


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

    The HTTP client and the operator call this without knowing which Action they serve.
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
