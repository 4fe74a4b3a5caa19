"""Everything a worker puts on JetStream: chunks, results, DLQ entries and receipts.

Chunks go out with `publish_async` (bounded in flight, ~8x an awaited publish here) and are
confirmed before the Action settles; a result is published awaited, because the delivery is
acked only after it is durable. Every message carries a `Nats-Msg-Id`, so a republish after a
crash or a retry is dropped by the server inside the duplicate window. Chunks and results are
AIP Envelopes made by `worker.wire.chunks` / `worker.wire.results` (a result already signed
inside, `security.signature`), escalations and their resolutions by `worker.wire.escalations`
(signed inside), channel deliveries and ingress messages by `worker.wire.channels` (signed
inside), DLQ entries by `worker.wire.dead_letters` (signed inside), receipts by
`worker.wire.receipts` (a segment's last one signed inside, `worker.bus.audit`): each reader
believes only what a trusted worker signed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck

from schemas.aip.extensions import DeadLetterFacts
from schemas.audit import Receipt
from schemas.channel import ChannelDelivery, ChannelMessage
from schemas.chunk import StreamChunk
from schemas.escalation import Escalation, EscalationResolution
from subjects.grammar import (
    Subjects,
    chunk_msg_id,
    escalation_resolution_msg_id,
    result_msg_id,
)
from worker import tracing
from worker.aip.signing import AipSigner
from worker.bus.flush import flushed_in_order
from worker.bus.publish_health import PublishHealth
from worker.errors import PublishFailed, StreamFull
from worker.wire.channels import encode_delivery, encode_inbound, inbound_dedupe_id
from worker.wire.chunks import encode_chunk
from worker.wire.dead_letters import encode_dead_letter
from worker.wire.escalations import encode_escalation, encode_resolution
from worker.wire.receipts import encode_receipt

if TYPE_CHECKING:  # the trust package imports the runtime's modules, which import this one
    from worker.bus.acked_publish import AckedPublisher
    from worker.trust.responses import ResponseSigner

log = logging.getLogger(__name__)

MSG_ID = "Nats-Msg-Id"
#: A chunk's MAC under its delivery's chain key (`worker.execution.chunk_chain`, which
#: reads it; defined here so the bus package does not import the execution's).
CHAIN_MAC_HEADER = "AIP-Chunk-Mac"
#: Bytes of `max_payload` kept for the headers a worker sends with a result or chunk
#: (`Nats-Msg-Id`, the signature headers): NATS counts headers and body together.
HEADER_ROOM = 4096
#: The NATS server default, used until the server's INFO says otherwise.
DEFAULT_MAX_PAYLOAD = 1024 * 1024


#: JetStream's answers to a publish that a full stream (`discard: new`) or a full store
#: refused: repeating the publish cannot succeed until something is removed.
_FULL_ERR_CODES = frozenset({10077, 10023, 10047})


def refused_by_stream(exc: BaseException) -> bool:
    """JetStream refused the message because the stream is at one of its own limits
    (`discard: new` past `max_msgs`/`max_bytes`): the stream's configured answer, the
    same for every repeat. Anything else (a full or failed store, JetStream disabled, no
    answer) is the bus failing, and the same publish succeeds once the bus is back."""
    description = str(getattr(exc, "description", "") or "")
    return getattr(exc, "err_code", None) == 10077 and description.startswith("maximum")


def chunk_headers(
    chunk: StreamChunk,
    payload: bytes,
    sha256: str | None = None,
    mac: str | None = None,
    trace: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A chunk's headers: its content-bound `Nats-Msg-Id` (seq and the bytes' hash, so a
    republish of the same bytes is a duplicate and a forgery at that seq is not), its
    chain MAC when the chunk stream gives one, and its batch's trace context when traced
    (`worker.tracing`; computed once per batch, not per chunk)."""
    digest = sha256 or hashlib.sha256(payload).hexdigest()
    headers = {MSG_ID: chunk_msg_id(chunk.action_id, chunk.seq, digest)}
    if mac is not None:
        headers[CHAIN_MAC_HEADER] = mac
    if trace:
        headers.update(trace)
    return headers


def confirmed(future: asyncio.Future[PubAck]) -> bool:
    """The chunk is stored: its PubAck arrived (nothing to wait for or re-send)."""
    return future.done() and not future.cancelled() and future.exception() is None


def receipt_headers() -> dict[str, str] | None:
    """The headers of an audit receipt's publish, whoever sends it (worker, gateway, CLI):
    the trace context only, never a `Nats-Msg-Id`. A receipt is published once and never
    re-sent, so a dedupe id would drop nothing of ours, and receipt ids are predictable
    (Action, event, fence, author, counter or time): with one, anyone who may publish on
    the audit subject could store a message under a genuine receipt's id first and have
    the genuine receipt dropped as its duplicate. Without it both are stored and `audit`
    believes the one a trusted key signed or links to (`AipClient.audit_chain`). It also
    spares client and server the header (~4 µs each per receipt). None when tracing is
    off (a plain publish, no headers at all)."""
    headers: dict[str, str] = {}
    tracing.inject(headers)
    return headers or None


class BusPublisher:
    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        *,
        confirm_timeout_s: float = 5.0,
        signer: ResponseSigner | None = None,
        acks: AckedPublisher | None = None,
        nc: NATS | None = None,
    ) -> None:
        self.js = js
        #: The connection `js` runs on, when the caller holds it (the app does; so does
        #: `acks`): its server's `max_payload`, and the plain publish receipts take. Without
        #: it a publisher assumes the server default and sends receipts through `js`.
        self.nc = nc if nc is not None else acks.nc if acks is not None else None
        self.subjects = subjects
        self.confirm_timeout_s = confirm_timeout_s
        #: Signs results and DLQ entries; None publishes them unsigned (development only).
        self.signer = signer
        #: Awaited before a result is published, with its Action id: the audit log's `seal`,
        #: so the receipts emitted before a result are on the stream when it is.
        self.before_result: Callable[[str], Awaitable[None]] | None = None
        #: Where chunks are published with a later confirmation: the worker's own reply
        #: subscription (`worker.bus.acked_publish`, half the CPU per chunk), or nats-py's
        #: `publish_async` for a publisher that sends few (the CLI's, the tests').
        self.acks = acks
        #: Every awaited publish's outcome (and each chunk the chunk stream held back),
        #: what `/ready` reports (`worker.bus.publish_health`).
        self.health = PublishHealth()

    async def flushed(self, timeout_s: int) -> None:
        """Wait until the bus server has every message published on this connection so far
        (a PING answered after them, `worker.bus.flush`), for `timeout_s` at most; never
        raises. A process killed after this returns has left them on the bus, whatever it
        had buffered."""
        nc = self.nc
        if nc is None or not nc.is_connected:
            return
        try:
            await flushed_in_order(nc, timeout_s)
        except Exception as exc:  # a slow or lost server: the caller goes on regardless
            log.debug("bus flush not confirmed: %s", type(exc).__name__)

    def max_message_bytes(self) -> int:
        """The largest body one result or chunk may have: the server's `max_payload` (from
        its INFO, so a deployment's own limit counts) less the room for our headers."""
        nc = self.nc
        max_payload = (nc.max_payload if nc is not None else 0) or DEFAULT_MAX_PAYLOAD
        return int(max_payload) - HEADER_ROOM

    def _publish_async(
        self, subject: str, payload: bytes, headers: dict[str, str], wait_stall: float
    ) -> Awaitable[asyncio.Future[PubAck]]:
        """`self.acks.publish` when the worker has its own acknowledgement subscription
        (the hot path); else nats-py's `js.publish_async`, for a publisher that sends few.
        The publish itself, to be awaited: not a coroutine of its own around it (like
        `chunk`: a frame fewer per chunk)."""
        if self.acks is not None:
            return self.acks.publish(subject, payload, headers, wait_stall)
        return self.js.publish_async(subject, payload, headers=headers, wait_stall=wait_stall)

    def chunk(
        self,
        chunk: StreamChunk,
        data: bytes | None = None,
        *,
        subject: str | None = None,
        sha256: str | None = None,
        mac: str | None = None,
        trace: Mapping[str, str] | None = None,
    ) -> Awaitable[asyncio.Future[PubAck]]:
        """Send a chunk now (as `data`, with its `sha256`, when the caller already encoded
        and hashed it; to `subject` when the caller already built the Action's chunk
        subject, as a stream of thousands of chunks does once; with `mac`, its chain MAC:
        `worker.execution.chunk_chain`; with `trace`, its batch's trace headers); awaited,
        the publish gives the future that confirms it (see `confirm`)."""
        payload = encode_chunk(chunk) if data is None else data
        headers = chunk_headers(chunk, payload, sha256, mac, trace)
        if trace is None:
            tracing.inject(headers)  # a lone chunk (the terminal one): the current span's
        return self._publish_async(
            subject or self.subjects.chunks(chunk.endpoint_id, chunk.action_id),
            payload,
            headers,
            self.confirm_timeout_s,
        )

    async def chunk_awaited(self, chunk: StreamChunk, data: bytes | None = None) -> PubAck:
        """One awaited publish of a chunk (as `data` when the caller holds its bytes)."""
        payload = encode_chunk(chunk) if data is None else data
        return await self._publish(
            self.subjects.chunks(chunk.endpoint_id, chunk.action_id),
            payload,
            chunk_headers(chunk, payload)[MSG_ID],
        )

    async def chunk_once(
        self,
        chunk: StreamChunk,
        data: bytes,
        *,
        subject: str | None = None,
        mac: str | None = None,
    ) -> PubAck:
        """One awaited publish of a chunk (its exact bytes `data`) whose confirmation went
        missing, no retry: the chunk stream holds it back when the bus refuses it
        (`worker.execution.chunk_stream`)."""
        payload = data
        headers = chunk_headers(chunk, payload, mac=mac)
        tracing.inject(headers)
        try:
            ack = await self.js.publish(
                subject or self.subjects.chunks(chunk.endpoint_id, chunk.action_id),
                payload,
                timeout=self.confirm_timeout_s,
                headers=headers,
            )
        except Exception as exc:
            if not refused_by_stream(exc):
                self.health.failed(exc)
            raise
        self.health.succeeded()
        return ack

    async def confirm(
        self, pending: list[tuple[StreamChunk, bytes, asyncio.Future[PubAck]]]
    ) -> None:
        """Wait for chunk confirmations; a failed one is sent once more (same Msg-Id).

        One wait for the whole batch (at most `confirm_timeout_s`), not a timer per chunk:
        most acks have arrived by the time a batch is confirmed. A confirmation still
        missing after the wait is cancelled (which frees its in-flight slot) and its chunk
        published again, awaited, in seq order.
        """
        waiting = [future for _, _, future in pending if not future.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=self.confirm_timeout_s)
        for chunk, data, future in pending:
            if confirmed(future):
                continue
            future.cancel()
            try:
                await self.chunk_awaited(chunk, data)
            except Exception as exc:
                raise PublishFailed(f"chunk {chunk.seq}: {type(exc).__name__}") from None

    async def result_bytes(self, endpoint_id: str, action_id: str, stored: bytes) -> PubAck:
        """Publish a result Envelope as stored (signed when it was sealed), byte for byte; a
        republish of the same bytes has the same Msg-Id (whichever worker sends it) and is
        dropped as a duplicate."""
        if self.before_result is not None:
            await self.before_result(action_id)
        digest = hashlib.sha256(stored).hexdigest()
        subject = self.subjects.results(endpoint_id, action_id)
        msg_id = result_msg_id(action_id, digest)
        headers: dict[str, str] = {}
        with tracing.producing(
            subject,
            headers,
            {"messaging.message.id": msg_id, "messaging.message.body.size": len(stored)},
        ):
            return await self._publish(subject, stored, msg_id, headers)

    async def escalation(self, escalation: Escalation, *, risk: str | None = None) -> PubAck:
        """Awaited, like a result: it is published before the result it belongs to, so a
        crash in between republishes both (the id makes the copy a server-side duplicate).
        An `aip.core.v1.escalation` Envelope signed by the worker's response key
        (`worker.wire.escalations`): readers ignore one no trusted worker signed. `risk` is
        the capability's."""
        payload = encode_escalation(
            escalation, signer=self.signer.aip if self.signer is not None else None, risk=risk
        )
        return await self._publish(
            self.subjects.escalations(escalation.endpoint_id),
            payload,
            escalation.escalation_id,
        )

    async def channel_delivery(self, delivery: ChannelDelivery) -> PubAck:
        """Awaited and before the source's result, like an escalation (same reasoning): the
        delivery's `session_chat` Action Envelope (`worker.wire.channels`), signed by the
        worker's response key, so the egress intake runs only what a trusted worker queued."""
        return await self._publish(
            self.subjects.egress(delivery.endpoint_id),
            encode_delivery(delivery, signer=self._aip_signer()),
            delivery.delivery_id,
        )

    async def channel_message(self, subject: str, message: ChannelMessage) -> PubAck:
        """A followed session's message, awaited: the cursor moves only after it is stored.
        An `aip.channel.v1.message_created` Envelope signed by the worker's response key, so
        readers (and the ingress cursor) can tell it from one forged there."""
        return await self._publish(
            subject,
            encode_inbound(message, signer=self._aip_signer()),
            inbound_dedupe_id(message.endpoint_id, message.message_id),
        )

    def _aip_signer(self) -> AipSigner | None:
        return self.signer.aip if self.signer is not None else None

    async def escalation_resolution(
        self, resolution: EscalationResolution, *, signer: AipSigner | None
    ) -> PubAck:
        """The stream's copy of a resolution (Redis holds the write-once record): an
        `aip.core.v1.escalation_resolution` Envelope signed by `signer`, the key of the
        person who resolved it (None: unsigned, development only)."""
        return await self._publish(
            self.subjects.escalation_resolutions(resolution.endpoint_id),
            encode_resolution(resolution, signer=signer),
            escalation_resolution_msg_id(resolution.escalation_id),
        )

    async def dead_letter(
        self,
        facts: DeadLetterFacts,
        *,
        action_id: str | None,
        status: Mapping[str, Any] | None = None,
    ) -> PubAck:
        """A DLQ entry: an `action_status` Envelope (`dead_lettered`) signed by this worker's
        key (`worker.wire.dead_letters`; `status`: its further ActionStatus fields),
        `Nats-Msg-Id` its entry id; `StreamFull` when the DLQ refuses it (waiting would not
        help)."""
        signer = self.signer.aip if self.signer is not None else None
        return await self._publish(
            self.subjects.dlq(facts.endpoint_id),
            encode_dead_letter(facts, action_id=action_id, signer=signer, status=status),
            facts.dlq_id,
            give_up_when_full=True,
        )

    async def ack_confirmed(self, msg: Msg, timeout_s: float) -> None:
        """`msg.ack_sync`: the ack and the server's answer, on the worker's own reply
        subscription when it has one (`worker.bus.acked_publish`)."""
        if self.acks is not None:
            await self.acks.ack_confirmed(msg, timeout_s)
        else:
            await msg.ack_sync(timeout=timeout_s)

    async def receipt(self, receipt: Receipt, payload: bytes | None = None) -> None:
        """Best effort, never blocks the delivery: a lost receipt must not stall real work.

        Sent as a plain NATS publish to the audit stream's subject (JetStream stores it all
        the same) rather than with `publish_async`: no caller ever waited for a receipt's
        acknowledgement, so asking the server for one (a reply inbox, a future and a JSON
        PubAck per receipt) bought nothing. No `Nats-Msg-Id` (`receipt_headers` says why).
        `payload` is the receipt's `receipt_chain` Envelope as `worker.bus.audit` sealed it
        (signed when it ends a segment, so `audit` can exclude a receipt another role
        appended); None sends it unsigned (`worker.wire.receipts`).
        """
        try:
            subject = self.subjects.audit(receipt.endpoint_id, receipt.action_id)
            if payload is None:
                payload = encode_receipt(receipt, signer=None)[0]
            headers = receipt_headers()
            nc = self.nc
            if nc is not None:
                await nc.publish(subject, payload, headers=headers)
            else:
                await self._publish_async(subject, payload, headers or {}, 0.5)
        except Exception as exc:
            log.warning("audit receipt not published: %s", type(exc).__name__)

    async def _publish(
        self,
        subject: str,
        payload: bytes,
        msg_id: str,
        headers: Mapping[str, str] | None = None,
        *,
        give_up_when_full: bool = False,
    ) -> PubAck:
        """Publish awaited, retried on any failure for up to three confirm timeouts; with
        `give_up_when_full`, a full stream raises `StreamFull` at once instead."""
        all_headers = dict(headers or {})
        all_headers[MSG_ID] = msg_id
        tracing.inject(all_headers)  # after any signature: none covers these headers
        delay = 0.05
        deadline = asyncio.get_running_loop().time() + self.confirm_timeout_s * 3
        acks = self.acks
        while True:
            try:
                if acks is not None:  # the worker's own reply subscription: same answers
                    ack = await acks.publish_awaited(
                        subject, payload, all_headers, self.confirm_timeout_s
                    )
                else:
                    ack = await self.js.publish(
                        subject, payload, timeout=self.confirm_timeout_s, headers=all_headers
                    )
            except Exception as exc:
                if not refused_by_stream(exc):
                    self.health.failed(exc)
                if give_up_when_full and getattr(exc, "err_code", None) in _FULL_ERR_CODES:
                    raise StreamFull(f"{subject}: {getattr(exc, 'description', '')}") from None
                if asyncio.get_running_loop().time() + delay > deadline:
                    raise PublishFailed(f"{subject}: {type(exc).__name__}") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            else:
                self.health.succeeded()
                return ack
