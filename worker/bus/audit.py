"""Audit receipts: one redacted record per decision a worker takes about an Action.

Receipts are signed in segments, because an Ed25519 signature per receipt (~22 µs, and an
operator Action leaves ~8 receipts) would cost the hot path ~13 % of its 1.38 ms of CPU per
Action (`python -m tests.bench.receipt_signing`). The receipts this process sends about one
Action within `SEAL_AFTER_S` of each other form a segment: each names the sha256 of the one
before it (`prev_sha256`), and the segment's last receipt is held until no next one came
for `SEAL_AFTER_S` or until the Action's result is published (`seal`), then sent signed; a
receipt that ends a segment (`ENDS_SEGMENT`: a lease released or lost, a refusal) is sent
signed at once, the one held before it unsigned. `audit` believes a receipt that a trusted
worker signed or that a signed receipt links back to. The price: a receipt that ends no
segment and precedes no result (a run bound, a cancel requested) reaches the stream up to
`SEAL_AFTER_S` later, and a process killed within that time loses it, which leaves the
receipts it sent of that segment unverified (reported, never believed).
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
from worker.hermes.exchange import Exchange

log = logging.getLogger(__name__)

#: How long the last receipt of an Action's segment waits for a next one before it is sent
#: signed: receipts emitted together (an Action's start, its settle and release) share one
#: signature. It bounds how late a receipt arrives and what a kill -9 takes with it.
SEAL_AFTER_S = 0.1


#: Events after which this process has nothing more to say about the Action for now (its
#: lease is gone, or it never took one): the receipt is sent signed at once, so a process
#: killed right after a lease loss or a release leaves that receipt on the stream, verified.
ENDS_SEGMENT = frozenset(
    {
        ReceiptEvent.REFUSED,
        ReceiptEvent.DEAD_LETTERED,
        ReceiptEvent.LEASE_LOST,
        ReceiptEvent.LEASE_RELEASED,
        ReceiptEvent.DUPLICATE,
        ReceiptEvent.FENCED_OUT,
        ReceiptEvent.REPUBLISHED,
        ReceiptEvent.CANCEL_REFUSED,
        ReceiptEvent.CANCEL_CONFIRMED,
    }
)


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
    held receipts are sent signed once `SEAL_AFTER_S` passed (at once on `seal` and
    `drain`). A receipt
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
        held = self._held
        loop = asyncio.get_running_loop()
        try:
            while True:
                outbox = self._take_queue(publisher, loop.time() + SEAL_AFTER_S)
                now = loop.time()
                while held:
                    action_id, oldest = next(iter(held.items()))
                    if not self._closing and oldest.due > now:
                        break
                    del held[action_id]
                    outbox.append((oldest.receipt, oldest.payload, True))
                if outbox:
                    await _send_all(publisher, outbox)
                    continue  # more may have been queued while these went out
                if self._queue:
                    continue
                if not held:
                    break
                await asyncio.sleep(next(iter(held.values())).due - now)
        finally:
            self._sender = None

    def _take_queue(self, publisher: BusPublisher, due: float) -> list[_Outgoing]:
        """Link every queued receipt to the one held for the same Action and hold it; the
        receipts that lost their place are returned to be sent unsigned (no await here, so
        the sender and `seal` never link the same receipt twice)."""
        outbox: list[_Outgoing] = []
        queue, held = self._queue, self._held
        while queue:
            receipt = queue.popleft()
            if publisher.signer is None:  # nothing is signed, so nothing is linked
                outbox.append((receipt, None, False))
                continue
            before = held.pop(receipt.action_id, None)
            if before is not None:
                # Linked before it is sent: a receipt lost then breaks the chain visibly
                # (audit reports the receipts before it unverified) instead of silently.
                receipt = msgspec.structs.replace(
                    receipt, prev_sha256=hashlib.sha256(before.payload).hexdigest()
                )
                outbox.append((before.receipt, before.payload, False))
            if receipt.event in ENDS_SEGMENT:
                outbox.append((receipt, encode(receipt), True))
            else:
                held[receipt.action_id] = _Held(receipt, encode(receipt), due)
        return outbox

    async def seal(self, action_id: str) -> None:
        """Send the Action's open segment now, its last receipt signed: called before the
        Action's result is published, so whoever reads the result finds its receipts (the
        ones emitted before it) already on the stream. Never raises."""
        publisher = self.publisher
        if publisher is None or publisher.signer is None:
            return
        due = asyncio.get_running_loop().time() + SEAL_AFTER_S
        outbox = self._take_queue(publisher, due)
        last = self._held.pop(action_id, None)
        if last is not None:
            outbox.append((last.receipt, last.payload, True))
        await _send_all(publisher, outbox)

    async def drain(self, timeout_s: float = 2.0) -> None:
        """Send what is queued and held (held receipts signed at once), for up to `timeout_s`."""
        self._closing = True
        sender = self._sender
        if sender is not None:
            await asyncio.wait([sender], timeout=timeout_s)


#: A receipt to send: the receipt, its encoded bytes (None: encode it), and whether signed.
_Outgoing = tuple[Receipt, bytes | None, bool]


async def _send_all(publisher: BusPublisher, outbox: list[_Outgoing]) -> None:
    for receipt, payload, sign in outbox:
        await _guarded(publisher.receipt(receipt, payload, sign=sign), receipt)


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
