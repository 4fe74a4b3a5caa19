"""The one follower of a streaming Action's chunks for the bindings that pass them on: the
native NATS binding (to the Action's `callback`, worker/gateway/chunk_sinks.py) and the
connector host (to the central callback, worker/gateway/connector_stream.py).

It reads the child's chunk subject once, from the stream sequence it reached (message
gets, worker/bus/stream_reads.py: no consumer, nothing read twice), and checks the hash
chain link by link with the project's one chain checker, `ChunkSequencer`
(worker/trust/responses.py: each chunk released once, in seq order, only when it names the
hash of the one released before it and no other chunk claims its seq; a chunk read ahead of
a missing seq waits for it; at a fork nothing more is released until the signed result
names the chain's last chunk; memory bounded by `MAX_HELD_CHUNKS` / `MAX_HELD_BYTES` per
follow, and over all the follows of the process by `HeldChunkBudget`,
worker/gateway/held_chunks.py). A
message that does not decode as a chunk of this child is skipped.

It ends on the child's signed result (`Children.stored_result`: a trusted worker key, this
child's id and envelope hash), never on a terminal chunk's presence alone: the terminal
chunk is released only once the result names its hash, and a result naming no chunk ends
the follow at once (an Action that published none). It also ends at the binding's
deadline, `SETTLE_GRACE_S` after the result when the chain it names is not all stored, or
after `MAX_READS` reads.

When a chunk is released is each binding's `Release` policy:

* `Release.VOUCHED` (the native binding): nothing before the signed result vouches for the
  chain, then exactly that chain (a superseded run's or a forger's chunks are never sent,
  even a forgery that links to the real chain and came first). The chunks are held until
  then (bounded).
* `Release.LIVE` (the connector host): each chunk as soon as its link is verified, while
  the Action runs, as the reference connector host forwards chunks and the central expects
  them. After a fork the rest waits for the result. A chunk forwarded while it was alone at
  its seq can turn out, once the result names the chain, not to be on it (its competitor
  was stored later); the central cannot be told to forget it (AIP has no retraction), so
  the forwarding stops there and the follow reports it (`not_vouched`).

What is not passed on is reported, typed: counted in
`aip_gateway_chunk_chain_breaks_total{binding,reason}` and logged with
`connector_host.response_signing` (the code of every bus message the gateway cannot believe
as the executor's, as for refused results, docs/gateway.md). A sink that cannot take a
chunk ends the release (no gap is ever left behind a chunk that was sent): `Followed.cut`,
logged; the binding's answer still goes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Final, Protocol

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

from schemas.delegation import ChildAction
from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.result import ActionResult
from worker.bus.stream_reads import SubjectFollower
from worker.errors import UnverifiedResponse
from worker.gateway.children import Children
from worker.gateway.held_chunks import HeldChunkBudget
from worker.gateway.observe import GatewayMetrics
from worker.gateway.routes import Route
from worker.trust.responses import ChunkRetraction, ChunkSequencer, Sequenced, SequencedChunk
from worker.wire.chunks import decode_chunk

log = logging.getLogger(__name__)

#: How long one read waits for the next chunk before the follower looks for the result.
IDLE_S: Final = 0.2
#: How often the result is looked for while chunks keep arriving.
RESULT_EVERY_S: Final = 1.0
#: Wake-up fallback of the chunk subject's reads (a lost wake-up costs this much latency).
POLL_S: Final = 0.25
#: How long, once the signed result is read, the rest of the chain it names may take to be
#: read (the terminal chunk can be stored just after the result); past it the follow ends.
SETTLE_GRACE_S: Final = 2.0
#: Reads (a message, or an idle wait) of one follow at most.
MAX_READS: Final = 100_000
#: Chunks the follower holds at most (waiting for a missing seq, at a fork, or, under
#: `Release.VOUCHED`, for the result): as many as an events read takes.
MAX_HELD_CHUNKS: Final = 20_000
#: Their bytes at most.
MAX_HELD_BYTES: Final = 64 * 1024 * 1024
#: The code a break is logged with: a message on the bus the gateway cannot believe as the
#: executor's (docs/gateway.md, "Verified child results").
BREAK_CODE: Final = ErrorCode.HOST_RESPONSE_SIGNING


class Release(Enum):
    """When a verified link of the chain goes to the sink (the module docstring says why)."""

    VOUCHED = "vouched"
    LIVE = "live"


class BreakReason(StrEnum):
    """Why chunks on the child's subject were not passed on as its chain."""

    #: Not on the chain the signed result vouches for (a forgery, a superseded run's chunk,
    #: a chunk naming a wrong predecessor): dropped when the result resolved the fork.
    OFF_CHAIN = "off_chain"
    #: Forwarded live, then not on the chain the signed result vouches for (or the result
    #: vouches for no chunk at all, or for a malformed chain): forwarding stopped there.
    NOT_VOUCHED = "not_vouched"
    #: The signed result was read, but the follow ended (deadline, or the result's chain
    #: not all stored) with chunks still held at a fork or behind a missing seq.
    UNRESOLVED = "unresolved"
    #: More than the follower may hold or read: the rest is not passed on.
    OVER_BOUND = "over_bound"


class ChunkSink(Protocol):
    """Delivers one AIP StreamChunk body (named by the requester's Action id), in sequence
    order; raises (`NotDelivered`, or the transport's error) when it could not."""

    async def send(self, chunk: Mapping[str, Any]) -> None: ...


@dataclass
class Followed:
    """What one follow did."""

    #: Chunks the sink took.
    released: int = 0
    #: The child's signed result was read.
    settled: bool = False
    #: Everything released is the chain the signed result vouches for, to its terminal chunk.
    vouched: bool = False
    #: The release stopped early (the sink refused a chunk, or a break ended it).
    cut: bool = False
    #: The deadline passed before the result vouched for the chain.
    timed_out: bool = False
    #: Messages that decoded as no chunk of this child (skipped).
    skipped: int = 0
    breaks: Counter[BreakReason] = field(default_factory=Counter)


class ChunkFollower:
    """Follows one child's chunks into one sink under one release policy (`run`, once)."""

    def __init__(
        self,
        nc: NATS,
        children: Children,
        route: Route,
        child: ChildAction,
        *,
        caller_id: str,
        sink: ChunkSink,
        release: Release,
        deadline: float,
        binding: str,
        metrics: GatewayMetrics | None = None,
        budget: HeldChunkBudget | None = None,
    ) -> None:
        self.nc = nc
        self.children = children
        self.route = route
        self.child = child
        #: The requester's Action id: what the released chunks are named by.
        self.caller_id = caller_id
        self.sink = sink
        self.release = release
        #: `time.monotonic()` past which the follow ends.
        self.deadline = deadline
        self.binding = binding
        self.metrics = metrics
        #: The process-wide bound on held chunk bytes, and what this follow has charged.
        self.budget = budget
        self._charged = 0
        self.subject = route.subjects.chunks(child.id)
        self.outcome = Followed()
        self.order = ChunkSequencer(
            hold_until_vouched=release is Release.VOUCHED,
            verify_terminal=True,
            max_held=MAX_HELD_CHUNKS,
            max_held_bytes=MAX_HELD_BYTES,
        )
        #: When the signed result was read and named the chain (`time.monotonic()`).
        self._vouched_at: float | None = None
        self._ended = False

    async def run(self) -> Followed:
        try:
            stream = await self._stream()
            if stream is not None:
                async with SubjectFollower(self.nc, stream, self.subject, poll_s=POLL_S) as chunks:
                    await self._follow(chunks)
            else:  # no stream binds the subject: no chunk can exist, the result still ends it
                await self._await_result()
        finally:
            if self.budget is not None:
                self.budget.give(self._charged)
                self._charged = 0
        if self.outcome.settled and self.order.held and not self.order.done:
            self._break(BreakReason.UNRESOLVED, self.order.held)
        if self.order.dropped:
            self._break(BreakReason.OFF_CHAIN, self.order.dropped)
        self.outcome.vouched = self.order.done and not self.outcome.cut
        if self.outcome.skipped:
            log.info(
                "%d messages on %s are not chunks of %s and were skipped",
                self.outcome.skipped,
                self.subject,
                self.child.id,
                extra={"action_id": self.child.id},
            )
        return self.outcome

    async def _stream(self) -> str | None:
        try:
            stream: str = await self.nc.jetstream().find_stream_name_by_subject(self.subject)
        except NotFoundError:
            return None
        return stream

    async def _follow(self, chunks: SubjectFollower) -> None:
        looked = time.monotonic()
        for _ in range(MAX_READS):
            if self._ended or self.order.done:
                return
            now = time.monotonic()
            if now >= self.deadline:
                self.outcome.timed_out = True
                return
            if self._vouched_at is not None and now - self._vouched_at > SETTLE_GRACE_S:
                return  # the result's chain is not all stored: what is held is unresolved
            msg = await chunks.next(min(IDLE_S, self.deadline - now))
            if msg is not None:
                await self._take(msg.data or b"")
                # While chunks arrive the result is looked for now and then, at once when
                # nothing more can be released without it (a terminal chunk, a fork).
                waited = time.monotonic() - looked
                if waited < (IDLE_S if self.order.needs_result else RESULT_EVERY_S):
                    continue
            if self._vouched_at is None and not self._ended:
                looked = time.monotonic()
                await self._look_for_result()
        self._break(BreakReason.OVER_BOUND, 1)

    async def _await_result(self) -> None:
        while time.monotonic() < self.deadline:
            await self._look_for_result()
            if self._vouched_at is not None or self._ended:
                return
            await asyncio.sleep(min(IDLE_S, max(0.0, self.deadline - time.monotonic())))
        self.outcome.timed_out = True

    async def _take(self, data: bytes) -> None:
        """One message of the subject, through the chain checker."""
        try:
            chunk, _ = decode_chunk(data)
        except EnvelopeRejected:
            self.outcome.skipped += 1
            return
        if chunk.action_id != self.child.id:
            self.outcome.skipped += 1
            return
        try:
            released = self.order.add(data, chunk)
        except UnverifiedResponse as exc:  # more held than the bounds allow
            self._stop(BreakReason.OVER_BOUND, str(exc))
            return
        if not self._charge():
            return
        await self._pass_on(released)

    def _charge(self) -> bool:
        """Bring what this follow charged to the process budget to what it holds now;
        False (the release ended, `over_bound`) when the budget cannot take more."""
        if self.budget is None:
            return True
        held = self.order.held_bytes
        if held > self._charged:
            if not self.budget.take(held - self._charged):
                self._stop(
                    BreakReason.OVER_BOUND,
                    f"the gateway already holds {self.budget.held_bytes} bytes of chunks "
                    "over all its streams (AIPD_GATEWAY_MAX_HELD_CHUNK_BYTES "
                    f"{self.budget.max_bytes})",
                )
                return False
        else:
            self.budget.give(self._charged - held)
        self._charged = held
        return True

    async def _look_for_result(self) -> None:
        """Read the child's signed result; once there, the chain it names is what is
        released from now on."""
        try:
            found = await self.children.stored_result(self.route, self.child)
        except (NatsError, TimeoutError) as exc:  # a reconnect: look again later
            log.debug("result of %s not read: %s", self.child.id, type(exc).__name__)
            return
        if not isinstance(found, ActionResult):
            return  # none yet, or only refused ones (the gateway keeps following)
        self.outcome.settled = True
        last = found.last_chunk_sha256
        if last is None:
            if self.outcome.released:
                self._stop(BreakReason.NOT_VOUCHED, "its signed result vouches for no chunk")
            self._ended = True
            return
        self._vouched_at = time.monotonic()
        try:
            released = self.order.vouch(last, self.child.id)
        except UnverifiedResponse as exc:  # a malformed chain: nothing more is believable
            self._stop(BreakReason.NOT_VOUCHED, str(exc))
            return
        self._charge()  # a vouch only releases or drops: what is held shrinks
        await self._pass_on(released)

    async def _pass_on(self, released: list[Sequenced]) -> None:
        for item in released:
            if self._ended:
                return
            if isinstance(item, ChunkRetraction):
                self._stop(
                    BreakReason.NOT_VOUCHED,
                    f"chunks {item.from_seq}..{item.to_seq} forwarded are not on the chain "
                    "its signed result vouches for (AIP cannot take them back)",
                    count=item.to_seq - item.from_seq + 1,
                )
                return
            await self._send(item)

    async def _send(self, item: SequencedChunk) -> None:
        _, opened = decode_chunk(item.data)  # the StreamChunk body exactly as published
        try:
            await self.sink.send({**opened.payload, "action_id": self.caller_id})
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the callback's side: the binding's answer still goes
            log.warning(
                "chunk %d of %s not delivered to its callback (%s): stream cut",
                item.chunk.seq,
                self.child.id,
                type(exc).__name__,
                extra={"action_id": self.child.id},
            )
            self.outcome.cut = True
            self._ended = True
            return
        self.outcome.released += 1

    def _stop(self, reason: BreakReason, why: str, *, count: int = 1) -> None:
        """End the release on a break (nothing after it is passed on)."""
        log.warning(
            "%s: the chunks of %s on %s: %s; nothing more passed on",
            BREAK_CODE.value,
            self.child.id,
            self.subject,
            why,
            extra={"action_id": self.child.id, "code": BREAK_CODE.value},
        )
        self.outcome.cut = True
        self._ended = True
        self._break(reason, count, logged=True)

    def _break(self, reason: BreakReason, count: int, *, logged: bool = False) -> None:
        self.outcome.breaks[reason] += count
        if self.metrics is not None:
            self.metrics.chain_break(self.binding, reason.value, count)
        if not logged:
            log.warning(
                "%s: %d chunk(s) on %s not passed on as the chain of %s (%s)",
                BREAK_CODE.value,
                count,
                self.subject,
                self.child.id,
                reason.value,
                extra={"action_id": self.child.id, "code": BREAK_CODE.value},
            )
