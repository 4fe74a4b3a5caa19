"""What a settled Action owes the bus, published in one order by one object.

A settled Action (executed, refused, or found settled by a redelivery) owes the bus, in this
order: what the registered outputs make of its result (an escalation, then the channel
deliveries that may quote it), its terminal chunk, its result, and only then the ack of
every message of the delivery (docs/architecture.md §4, steps 6-8). Three callers owe it --
`Settle` after this worker's own fenced settle, `Answers.refuse` after a refusal's, and
`Answers.republish` when a redelivery finds the Action settled but its result missing from
the bus -- and all three go through `Outbox`, so the order and the contents cannot drift.

The result is stored as its signed AIP Envelope and the chunks as their Envelopes
(`worker.wire.results`, `worker.wire.chunks`): what is republished is byte for byte what
was first published, signature included, and the result's `last_chunk_sha256` still names
the stored terminal chunk's bytes.

The terminal chunk is stored with the result by the same settle script
(`worker/store/lua/settle.lua`), so whoever republishes a stored result republishes its
terminal chunk too: a consumer of the chunk subject sees exactly one terminal chunk after
any crash, and the result's `last_chunk_sha256` names it. A republish sends the terminal
chunk only when the stream does not already end with it, so a republish after the
duplicate window never stores a second copy. So too the chunks the bus refused while the
Action ran (a full JetStream store): the settle stores them beside the result, and they go
out before the terminal chunk, those the stream does not hold yet only, so the chain stays
gap-free. An Action of a non-streaming capability has no chunk stream (as upstream AIP):
nothing is stored beside its result, and its result alone is published and republished.
A publication the bus refuses raises `PublishFailed`: the delivery is nak'd and
its redelivery republishes from Redis, until the bus takes writes again.

The outputs are registered by the wiring (`worker/app.py`: the escalation output of
`worker/escalation/output.py`, the channel output of `worker/channel/output.py`); this module
imports neither. Each output is called after this worker's own fenced settle or for a
republished stored result only: a stale owner, refused by the fence, never gets here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from nats.aio.msg import Msg
from nats.js.api import PubAck
from nats.js.errors import NotFoundError

from schemas.action import Action
from schemas.audit import ReceiptEvent
from schemas.chunk import StreamChunk
from schemas.errors import EnvelopeRejected
from schemas.escalation import Escalation
from schemas.result import ActionResult, ResultStatus
from subjects.grammar import Subjects
from worker import faults
from worker.bus.audit import AuditLog
from worker.bus.publisher import BusPublisher
from worker.metrics import Metrics
from worker.trust.responses import sha256_hex
from worker.wire.chunks import decode_chunk
from worker.wire.results import decode_result

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Owed:
    """One settled Action on its way out: what the outputs read and what they add.

    `escalation` is filled by the escalation output (when the result raises one) and read
    by the outputs after it (a channel rule may deliver the escalation too).

    The outputs read the result decoded from the stored Envelope (`result`), as a republish
    does, so what they make of it is the same either way. It is decoded on first read: an
    output that `status` and `failed` already rule out (most results raise no escalation
    and spend no retry policy) never decodes it, which was ~2 % of an operator Action's
    CPU on the benchmark machine.
    """

    action: Action
    #: The stored result's status and whether it carries an error: what the settle that
    #: encoded it set (an Envelope decodes back to the same status and error presence).
    status: ResultStatus
    failed: bool
    #: The result's `action_result` Envelope as stored.
    stored: bytes
    #: True when a redelivery republishes a stored result (an output counts and logs a
    #: first publication only).
    republished: bool
    escalation: Escalation | None = None
    #: The delivery's first message: the Action Envelope as it was stored on the actions
    #: stream (what a DLQ entry keeps).
    message: Msg | None = None
    decoded: ActionResult | None = None

    @property
    def result(self) -> ActionResult:
        """The stored result, decoded once (EnvelopeRejected when it does not decode; a
        republish decodes it before any output runs, and skips them when it does not)."""
        if self.decoded is None:
            self.decoded = decode_result(self.stored, verify=False)[0]
        return self.decoded


class OutboxOutput(Protocol):
    """Something published with a settled result, before it (an escalation, a channel
    delivery). Called in registration order; `fault_point` is hit after it."""

    fault_point: str

    async def publish(self, owed: Owed) -> None: ...


@dataclass(frozen=True, slots=True)
class Settled:
    """A result as the settle script stored it, with the terminal chunk stored beside it
    (None for a non-streaming capability's result, which has no chunk stream) and the
    chunks the bus refused while the Action ran (newline-separated, oldest first; None:
    none owed)."""

    result: bytes
    terminal: bytes | None
    owed: bytes | None = None
    #: The chunk `terminal` encodes, when the caller holds it (the settle that made it):
    #: its subject and Msg-Id are read from it instead of decoding the bytes again.
    terminal_chunk: StreamChunk | None = None

    def owed_chunks(self) -> list[bytes]:
        return self.owed.split(b"\n") if self.owed else []


def decoded_result(stored: bytes | None) -> ActionResult | None:
    """The stored result (an `action_result` Envelope), or None when there is none or it
    does not decode (its signature, made by this deployment's workers, is not checked:
    Redis is the workers' own store)."""
    if stored is None:
        return None
    try:
        return decode_result(stored, verify=False)[0]
    except EnvelopeRejected:
        return None


def _chunk_of(data: bytes) -> StreamChunk | None:
    """A stored or published chunk Envelope's chunk; None when it does not decode."""
    try:
        return decode_chunk(data)[0]
    except EnvelopeRejected:
        return None


class Outbox:
    """The one publisher of what a settled Action owes the bus (see the module docstring)."""

    def __init__(
        self,
        *,
        publisher: BusPublisher,
        subjects: Subjects,
        audit: AuditLog,
        metrics: Metrics,
        outputs: Sequence[OutboxOutput],
    ) -> None:
        self.publisher = publisher
        self.subjects = subjects
        self.audit = audit
        self.metrics = metrics
        #: The wiring's list, read at each publication (channel egress registers late).
        self.outputs = outputs

    async def publish(
        self,
        msgs: list[Msg],
        action: Action,
        endpoint_id: str,
        settled: Settled,
        *,
        status: ResultStatus,
        failed: bool,
    ) -> None:
        """The first publication after this worker's own settle: outputs, terminal chunk,
        result, ack. `status` and `failed` (an error is set) are the stored result's, as
        the settle encoded it. The outputs read the result decoded from the stored
        Envelope (`Owed.result`), as a republish does: what they make of it (a channel
        delivery's text, an escalation) is the same either way (the Envelope's canonical
        JSON orders an output's keys)."""
        first = msgs[0] if msgs else None
        if self.outputs:
            owed = Owed(
                action=action,
                status=status,
                failed=failed,
                stored=settled.result,
                republished=False,
                message=first,
            )
            await self._outputs(owed)
        await self._terminal_and_result(endpoint_id, action.id, settled)
        faults.hit("before_ack", action.id)
        await self.ack_all(msgs)

    async def republish(
        self, msgs: list[Msg], action: Action, endpoint_id: str, settled: Settled
    ) -> None:
        """A redelivery of a settled Action: everything again only when the result is
        missing from the bus (a crash between settle and publish, or expired), then ack.

        Checked first: a republish after the duplicate window would otherwise store a
        second copy of everything. The outputs' messages carry the same ids as the first
        time, so a copy the first publication already stored is a server-side duplicate.
        """
        if not await self.result_on_stream(endpoint_id, action.id, settled.result):
            result = decoded_result(settled.result)
            if result is None:
                log.warning("stored result of %s does not decode; outputs skipped", action.id)
            else:
                owed = Owed(
                    action=action,
                    status=result.status,
                    failed=result.error is not None,
                    stored=settled.result,
                    republished=True,
                    message=msgs[0] if msgs else None,
                    decoded=result,
                )
                await self._outputs(owed)
            await self._terminal_and_result(
                endpoint_id, action.id, await self._missing(endpoint_id, action.id, settled)
            )
            self.audit.emit(ReceiptEvent.REPUBLISHED, action_id=action.id, endpoint_id=endpoint_id)
        await self.ack_all(msgs)

    async def _outputs(self, owed: Owed) -> None:
        for output in self.outputs:
            await output.publish(owed)
            faults.hit(output.fault_point, owed.action.id)

    async def _terminal_and_result(
        self, endpoint_id: str, action_id: str, settled: Settled
    ) -> None:
        """The chunks the bus refused earlier and the terminal chunk (when owed), then the
        result, the chunks confirmed together with the awaited result: one round trip, and
        the chunks, sent first on the same connection, are stored first, in seq order."""
        pending: list[tuple[StreamChunk, bytes, asyncio.Future[PubAck]]] = []
        for data in settled.owed_chunks():
            chunk = _chunk_of(data)
            if chunk is not None:
                pending.append((chunk, data, await self.publisher.chunk(chunk, data)))
        terminal = settled.terminal
        chunk = settled.terminal_chunk
        if chunk is None and terminal is not None:
            chunk = _chunk_of(terminal)
        if terminal is not None and chunk is not None:
            # Decoded for its subject and Msg-Id only: the stored bytes are what is sent.
            pending.append((chunk, terminal, await self.publisher.chunk(chunk, terminal)))
            faults.hit("after_terminal_chunk", action_id)
        await self.publisher.result_bytes(endpoint_id, action_id, settled.result)
        faults.hit("after_result_publish", action_id)
        if pending:
            await self.publisher.confirm(pending)
            self.metrics.chunk_published(endpoint_id, pending[0][0].kind.value)

    async def result_on_stream(
        self, endpoint_id: str, action_id: str, result: bytes | None = None
    ) -> bool:
        """Whether the Action's results subject ends with a result (with `result`: with
        exactly these stored bytes; a refusal of another envelope under the same id may
        have published after it, and then this one is owed again)."""
        try:
            last = await self.publisher.js.get_last_msg(
                self.subjects.stream_name("results"), self.subjects.results(endpoint_id, action_id)
            )
        except NotFoundError:
            return False
        return result is None or last.data == result

    async def envelope_answered(self, endpoint_id: str, action_id: str, envelope: bytes) -> bool:
        """True when the Action's results subject ends with a result for exactly `envelope`
        (its `action_sha256`): the envelope has its answer, whatever Redis still holds."""
        try:
            last = await self.publisher.js.get_last_msg(
                self.subjects.stream_name("results"), self.subjects.results(endpoint_id, action_id)
            )
        except NotFoundError:
            return False
        result = decoded_result(last.data)
        return (
            result is not None
            and result.action_id == action_id
            and result.action_sha256 == sha256_hex(envelope)
        )

    async def _missing(self, endpoint_id: str, action_id: str, settled: Settled) -> Settled:
        """`settled` less the chunks the Action's chunk stream already holds: the owed ones
        up to its last seq, and the terminal one when the stream ends with it (a crash after
        the chunks were stored and before the result was)."""
        if settled.terminal is None and not settled.owed:
            return settled
        try:
            last = await self.publisher.js.get_last_msg(
                self.subjects.stream_name("chunks"), self.subjects.chunks(endpoint_id, action_id)
            )
        except NotFoundError:
            return settled
        last_data = last.data or b""
        last_chunk = _chunk_of(last_data)
        last_seq = last_chunk.seq if last_chunk is not None else -1
        owed = [
            c for c in settled.owed_chunks() if (o := _chunk_of(c)) is not None and o.seq > last_seq
        ]
        terminal = settled.terminal
        stored_terminal = _chunk_of(terminal) if terminal is not None else None
        if terminal is not None and (
            last_data == terminal or stored_terminal is None or stored_terminal.seq <= last_seq
        ):
            terminal = None
        return Settled(settled.result, terminal, b"\n".join(owed) or None)

    async def ack_all(self, msgs: list[Msg]) -> None:
        for msg in msgs:
            try:
                await self.publisher.ack_confirmed(msg, 5.0)
            except Exception:
                log.info("ack not confirmed; a redelivery will republish the stored result")
