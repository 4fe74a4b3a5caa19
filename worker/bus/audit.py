"""Audit receipts: one redacted record per decision a worker takes about an Action.

Each receipt travels as an AIP Receipt in an `aip.audit.v1.receipt_chain` Envelope
(`worker.wire.receipts`). Receipts are signed in segments, because an Ed25519 signature per
receipt (~22 µs, and an operator Action leaves ~8 receipts) would cost the hot path ~13 % of
its 1.38 ms of CPU per Action (`python -m tests.bench.receipt_signing`). Every receipt is
sent at once, naming the AIP `hash` of the one this process sent before it about the same
Action (`previous_hash`, our `prev_sha256`); a
segment -- the receipts sent within `SEAL_AFTER_S` of each other -- is closed by a signed
`segment_sealed` receipt naming its last one, once no next one came for `SEAL_AFTER_S` or
before the Action's result is published (`seal`, which instead sends the Action's last
still-queued receipt signed, when there is one); a receipt that ends a segment
(`ENDS_SEGMENT`: a lease released or lost, a refusal) is itself sent signed. `audit`
believes a receipt that a trusted worker signed or that a signed receipt links back to.
Nothing is held back, so a process killed mid-run leaves every receipt it emitted on the
stream (the receipt chain of a killed run still tells its story; before the operator's start,
the one unsafe request, `hand_over` waits until the bus server has them, so not even a kill
right after the send can catch them in this process's buffers); only the seal of its last
segment is missing, so `audit` reports that segment's receipts as not verified, never as
believed. A segment's signed Envelope vouches for every receipt it links back to because a
receipt's hash covers its `previous_hash` (aip-1.0-wire.md §2.7).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field

import msgspec

from schemas.audit import DetailValue, Receipt, ReceiptEvent
from worker.bus.publisher import BusPublisher
from worker.hermes.exchange import Exchange
from worker.wire.receipts import ReceiptFramer

log = logging.getLogger(__name__)

#: How long an Action's open segment waits for a next receipt before it is sealed: receipts
#: emitted together (an Action's start, its settle and release) share one signature.
SEAL_AFTER_S = 0.1


#: How long `hand_over` waits for the bus server to confirm it has the receipts.
HAND_OVER_S = 1  # whole seconds: nats-py's `flush` takes an int


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
    """An Action's open segment: its last receipt (already sent, unsigned), its AIP `hash`
    (the next one's `previous_hash`), and when the segment is sealed."""

    receipt: Receipt
    sha256: str
    due: float


class AuditLog:
    """Emits receipts without ever blocking or failing the delivery that produced them.

    Receipts wait in a queue that one sender task empties (started on demand, ending when
    nothing is queued and no segment is open), in the order they were emitted: a task per
    receipt cost more CPU than publishing the receipt itself. With a signer, the sender links
    each receipt to the last one it sent for the same Action and keeps that Action's segment
    open; an open segment is sealed (a signed `segment_sealed` receipt) once `SEAL_AFTER_S`
    passed, at once on `seal` and `drain`. A receipt that cannot be sent is logged and
    skipped; it never ends the sender, so it never costs the receipts queued behind it.
    """

    def __init__(self, publisher: BusPublisher | None, worker_id: str) -> None:
        self.publisher = publisher
        self.worker_id = worker_id
        self._counter = itertools.count()
        self._queue: deque[Receipt] = deque()
        self._sender: asyncio.Task[None] | None = None
        #: Each Action's open segment, in the order they fall due (a re-held one moves last).
        self._held: dict[str, _Held] = {}
        #: Set by `drain`: every open segment is sealed at once.
        self._closing = False
        #: Starts a sender when the oldest open segment falls due (`_arm_timer`).
        self._timer: asyncio.TimerHandle | None = None
        #: Frames every receipt this log sends (`encode_receipt`'s bytes, for less CPU).
        self._framer = ReceiptFramer()

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
        self._start_sender()

    async def _send(self, publisher: BusPublisher) -> None:
        """Send what is queued, and seal the segments that fell due, until nothing is left
        to send now; it never sleeps, so a receipt is on its way as soon as it is emitted
        (a kill -9 right after a step keeps that step's receipt). The next seal is a timer
        (`_arm_timer`), which starts a sender again when it falls due."""
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
                    outbox.append(self._seal_of(oldest, publisher))
                if outbox:
                    await _send_all(publisher, outbox, self._framer)
                    continue  # more may have been queued while these went out
                if not self._queue:
                    break
        finally:
            self._sender = None
            self._arm_timer()

    def _arm_timer(self) -> None:
        """Start a sender when the oldest open segment falls due (one timer at a time)."""
        if self._timer is not None or not self._held or self.publisher is None:
            return
        loop = asyncio.get_running_loop()
        due = next(iter(self._held.values())).due
        self._timer = loop.call_at(due, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._start_sender()

    def _start_sender(self) -> None:
        if self._sender is None and self.publisher is not None:
            self._sender = asyncio.get_running_loop().create_task(self._send(self.publisher))

    def _take_queue(
        self, publisher: BusPublisher, due: float, *, closing: str | None = None
    ) -> list[_Outgoing]:
        """Link every queued receipt to the last one sent for the same Action and return it
        to be sent now (signed when it ends its segment); the Action's segment stays open
        until `due` (no await here, so the sender and `seal` never link a receipt twice).
        The last queued receipt of the Action `closing` ends its segment (`seal`)."""
        outbox: list[_Outgoing] = []
        queue, held = self._queue, self._held
        last_of_closing = None
        if closing is not None:
            last_of_closing = next((r for r in reversed(queue) if r.action_id == closing), None)
        while queue:
            receipt = queue.popleft()
            if publisher.signer is None:  # nothing is signed, so nothing is linked
                outbox.append((receipt, None, False))
                continue
            ends = receipt.event in ENDS_SEGMENT or receipt is last_of_closing
            before = held.get(receipt.action_id)
            if before is not None:
                # Linked before it is sent: a receipt lost then breaks the chain visibly
                # (audit reports the receipts before it unverified) instead of silently.
                receipt = msgspec.structs.replace(receipt, prev_sha256=before.sha256)
            try:
                payload, digest = self._framer.encode(
                    receipt, signer=publisher.signer.aip if ends else None
                )
            except Exception as exc:  # cannot be framed: skipped like one not published
                # The rest of the queue still goes, and the Action's open segment stays as
                # it was: its next receipt links to the last one framed.
                _not_sent(receipt, exc)
                continue
            outbox.append((receipt, payload, ends))
            # A new last receipt moves the segment to the end of the seal order.
            held.pop(receipt.action_id, None)
            if not ends:
                held[receipt.action_id] = _Held(receipt, digest, due)
        return outbox

    def _seal_of(self, segment: _Held, publisher: BusPublisher) -> _Outgoing:
        """The signed receipt that closes `segment`, naming its last receipt."""
        last = segment.receipt
        seal = Receipt(
            receipt_id=(
                f"{last.action_id}:{ReceiptEvent.SEGMENT_SEALED.value}:{last.fence}:"
                f"{self.worker_id}:{next(self._counter)}"
            ),
            event=ReceiptEvent.SEGMENT_SEALED,
            action_id=last.action_id,
            endpoint_id=last.endpoint_id,
            worker_id=self.worker_id,
            fence=last.fence,
            trace_id=last.trace_id,
            ts_unix_ms=time.time_ns() // 1_000_000,
            prev_sha256=segment.sha256,
        )
        signer = publisher.signer.aip if publisher.signer is not None else None
        return seal, self._framer.encode(seal, signer=signer)[0], True

    async def seal(self, action_id: str) -> None:
        """Seal the Action's open segment now: called before the Action's result is
        published, so whoever reads the result finds its receipts (the ones emitted before
        it) on the stream and verifiable. Never raises.

        When a receipt of the Action is still queued (usually its `settled`, emitted just
        before the result), the last one is sent signed and ends the segment itself: the
        same one signature, one Envelope and one publish fewer per Action than an unsigned
        receipt followed by a `segment_sealed` one. Otherwise the open segment, already
        sent, is closed by a `segment_sealed` receipt naming its last receipt."""
        publisher = self.publisher
        if publisher is None or publisher.signer is None:
            return
        due = asyncio.get_running_loop().time() + SEAL_AFTER_S
        outbox = self._take_queue(publisher, due, closing=action_id)
        last = self._held.pop(action_id, None)
        if last is not None:
            outbox.append(self._seal_of(last, publisher))
        await _send_all(publisher, outbox, self._framer)

    async def hand_over(self) -> None:
        """Put every receipt emitted so far on the bus before the caller goes on: the
        sender publishes what is queued, then the bus server confirms it has them
        (`BusPublisher.flushed`). Called before an unsafe provider request (the operator's
        start), so a process killed right after sending it still leaves the receipts that
        led to it, its `start_claimed` among them: otherwise they could still sit in this
        process's queue or in the NATS client's buffer. Never raises; a bus that does not
        confirm within `HAND_OVER_S` delays the request by that much at most."""
        publisher = self.publisher
        if publisher is None:
            return
        sender = self._sender
        if sender is not None:
            # Shielded: a caller cancelled here must not cancel the sender, which serves
            # every Action's receipts.
            await asyncio.shield(sender)
        await publisher.flushed(HAND_OVER_S)

    async def drain(self, timeout_s: float = 2.0) -> None:
        """Send what is queued and seal every open segment at once, for up to `timeout_s`."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._start_sender()
        sender = self._sender
        if sender is not None:
            await asyncio.wait([sender], timeout=timeout_s)


#: A receipt to send: the receipt, its Envelope's bytes (None: frame it unsigned when it is
#: sent), and whether they are signed.
_Outgoing = tuple[Receipt, bytes | None, bool]


async def _send_all(
    publisher: BusPublisher, outbox: list[_Outgoing], framer: ReceiptFramer
) -> None:
    for receipt, payload, _signed in outbox:
        if payload is None:
            try:
                payload = framer.encode(receipt, signer=None)[0]
            except Exception as exc:  # cannot be framed: skipped like one not published
                _not_sent(receipt, exc)
                continue
        await _guarded(publisher.receipt(receipt, payload), receipt)


async def _guarded(sending: Awaitable[None], receipt: Receipt) -> None:
    try:
        await sending
    except Exception as exc:
        _not_sent(receipt, exc)


def _not_sent(receipt: Receipt, exc: Exception) -> None:
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
    #: Per polled route, what its last receipted read found (`polled`).
    last_polled: dict[str, tuple[int | None, str | None]] = field(default_factory=dict)


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


async def handed_over() -> None:
    """`AuditLog.hand_over` for the Action the current task executes (no-op outside one)."""
    scope = _scope.get()
    if scope is not None:
        await scope.log.hand_over()


#: Routes read again and again while a run is followed (the operator's status poll, every
#: `poll_interval_ms`, 250 ms by default, for as long as a taken-over run goes on): their
#: exchanges are receipted by `polled` when what they read changed, not once per poll (one
#: Action taken over used to leave ~190 receipts, against 8). `worker.operator.provider`
#: reads the run status on this route and reports each read to `polled`.
POLLED_ROUTES = frozenset({"/v1/runs/{run_id}"})


def provider_receipt(exchange: Exchange) -> None:
    """The `provider_request` receipt of one finished Hermes exchange: the hook the app wires
    into every `HermesClient`. Method, route template, status and duration only: never a
    body or a header value. A polled route's exchanges are left to `polled`."""
    if exchange.route in POLLED_ROUTES:
        return
    receipt(
        ReceiptEvent.PROVIDER_REQUEST,
        method=exchange.method,
        route=exchange.route,
        status=exchange.status,
        duration_ms=round(exchange.seconds * 1000, 1),
    )


def polled(
    route: str, *, method: str, status: int | None, state: str | None, duration_ms: float
) -> None:
    """The `provider_request` receipt of one read of a polled route, only when its answer
    (`status`, and the `state` it read, e.g. the run's status) differs from the last one
    receipted for the current Action: a poll that found what the previous one found is no
    new decision. The first read is always receipted."""
    scope = _scope.get()
    if scope is None:
        return
    found = (status, state)
    if scope.last_polled.get(route) == found:
        return
    scope.last_polled[route] = found
    scope.log.emit(
        ReceiptEvent.PROVIDER_REQUEST,
        action_id=scope.action_id,
        endpoint_id=scope.endpoint_id,
        fence=scope.fence,
        trace_id=scope.trace_id,
        facts={
            "method": method,
            "route": route,
            "status": status,
            "duration_ms": round(duration_ms, 1),
            "run_status": state,
        },
    )
