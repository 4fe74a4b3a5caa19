"""The chunks of one Action: the one owner of their sequence and hash chain.

An Action's chunks are `seq` 0, 1, 2, … with no gap, each naming the sha256 of the one
before, and exactly one terminal chunk (`done` or `error`) closing the stream after the
fenced settle (docs/architecture.md §4, steps 5-7). Every decision about that sequence is
made here:

- where it starts: 0 for an Action no worker published for, or, when this delivery took
  the Action over, after the chain's recorded head and the earlier owners' chunks that
  prove they follow it (`open`, `worker.execution.chunk_chain`) — never after whatever is
  last on the subject;
- the record of that head: after each confirmation collection the newest chunk stored
  with every chunk before it is recorded in the lease hash, fenced (`_record`), and every
  chunk carries its delivery's chain MAC;
- what `emit` publishes: the next seq, after the lease's local validity check (a paused
  worker stops before it publishes anything);
- the one terminal chunk: the first one an operation emits is held (later ones are
  dropped, so there is never a gap) and stored with the result by the settle, or one is
  made from the result (`closing`); the `Outbox` (worker/pipeline/outbox.py) publishes it,
  after a crash too;
- confirmation: chunks go out without waiting; while the run streams, confirmations that
  have already arrived are collected without waiting for the ones still on their way, and
  everything is confirmed at the end of the execution (`confirm`); a chunk whose
  confirmation has already arrived is let go on the way (a slow run
  held for minutes would otherwise keep up to `CONFIRM_BATCH` chunks, their payloads and
  PubAcks: most of its memory);
- a bus that refuses chunks (a full JetStream store, JetStream disabled, no answer): the
  first chunk it refuses is held back with every chunk made after it (`OWED_MAX_BYTES`),
  nothing overtakes it, and the operation runs on; `confirm` sends them once more at the
  end, and what is still refused then is `owed`, stored with the result by the settle and
  published by the `Outbox` before the terminal chunk once the bus takes writes again. Only
  a stream's own limit (`discard: new` past `max_msgs`/`max_bytes`) or an overflow of the
  held bytes fails the Action `stream_publication`;
- the terminal chunk of a refused Action, made only from its result's facts: at seq 0, or
  after the chain an earlier delivery of it left (`refusal_chunk`, `refusal_start`).
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import msgspec
from nats.js.api import PubAck

from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from schemas.errors import ErrorCode, ProtocolError
from schemas.result import ResultStatus
from worker import tracing
from worker.bus.publisher import BusPublisher, confirmed, refused_by_stream
from worker.errors import ConnectorError
from worker.execution.chunk_chain import ChainStart, chain_mac, continue_chain
from worker.execution.leases import HeldLease
from worker.metrics import Metrics
from worker.store.clock import now_ms
from worker.store.keys import ActionKeys
from worker.store.lease_store import ChunkHead, LeaseStore
from worker.wire.chunks import ChunkFramer

log = logging.getLogger(__name__)

TERMINAL_KINDS = frozenset({ChunkKind.DONE, ChunkKind.ERROR})
#: The trace headers of an untraced chunk: given (so the publisher adds none) and empty.
_UNTRACED: Mapping[str, str] = MappingProxyType({})

#: Chunks published since the last collection before `emit` collects the confirmations
#: that have arrived (without waiting for the rest).
CONFIRM_BATCH = 256
#: Unconfirmed chunks one Action may have before `emit` waits for the oldest batch: the
#: bound on its list and on how late a lost confirmation is noticed and re-sent. Twice the
#: batch, so the wait only ever concerns chunks a whole batch old, whose confirmations have
#: long arrived unless the bus is really behind (waiting on the newest ones, as a plain
#: "confirm every 256" did, stalled the relay for a round trip every 256 chunks: the tail
#: of figure 3's latency).
MAX_UNCONFIRMED = 2 * CONFIRM_BATCH
#: Once this many chunks are kept for confirmation, those already confirmed are let go
#: (and again each time the list has doubled since: `emit`).
PRUNE_EVERY = 8
#: Bytes of chunks one Action may hold back while the bus refuses them (kept in memory,
#: then stored in Redis with the result): past this the durable chunk sequence has stopped
#: and the Action fails `stream_publication`, the specification's answer. 4 MiB holds a
#: long streamed turn (about 10,000 token chunks) through an outage.
OWED_MAX_BYTES = 4 * 1024 * 1024


def _seq(sent: tuple[StreamChunk, asyncio.Future[PubAck]]) -> int:
    return sent[0].seq


class ChunkStream:
    """The chunk stream of one leased Action (see the module docstring)."""

    def __init__(
        self,
        publisher: BusPublisher,
        lease: HeldLease,
        *,
        action_id: str,
        endpoint_id: str,
        first_seq: int = 0,
        prev_sha256: str | None = None,
        metrics: Metrics | None = None,
        leases: LeaseStore | None = None,
        head_stream_seq: int = 0,
        operator: bool = False,
    ) -> None:
        self.publisher = publisher
        #: The chunks are the operator's (their AIP `data` is `{"hermes_operator": …}`).
        self.operator = operator
        self.lease = lease
        self.action_id = action_id
        self.endpoint_id = endpoint_id
        self.metrics = metrics
        #: Built (and the id checked) once, not for each of thousands of chunks.
        self._subject = publisher.subjects.chunks(endpoint_id, action_id)
        #: The chunks' wire bytes, with what every chunk of the Action shares printed once.
        self._framer = ChunkFramer(action_id, endpoint_id, operator=operator)
        self._seq = first_seq
        #: Hash of the last chunk published for this Action (by this worker, or by the one
        #: before a takeover, read back from the stream): the next chunk names it.
        self._prev_sha256 = prev_sha256
        self._pending: list[tuple[StreamChunk, asyncio.Future[PubAck]]] = []
        #: Where the chain's head is recorded (None: nowhere, for a stream no takeover
        #: continues, as in the unit tests of the stream itself).
        self.leases = leases
        #: Stream sequence of the last recorded chunk (0: none yet): where a takeover
        #: starts reading the subject.
        self._head_stream_seq = head_stream_seq
        #: The newest chunk known stored with every chunk before it: the head to record.
        self._frontier: tuple[StreamChunk, asyncio.Future[PubAck]] | None = None
        #: Seq of the head last recorded (-1: none), so an unchanged head is not re-sent.
        self._recorded_seq = -1
        #: Chunks emitted since confirmations were last collected (see `_collect`).
        self._since_collect = 0
        #: `len(_pending)` at which `emit` next lets go of confirmed chunks.
        self._prune_at = PRUNE_EVERY
        #: The terminal chunk the operation emitted, held for after the settle.
        self._terminal: StreamChunk | None = None
        #: Chunks the bus refused (a full store, JetStream disabled, no answer), with every
        #: chunk made after them, in seq order: sent again by `confirm`, else stored with
        #: the result (`owed`).
        self._owed: list[tuple[StreamChunk, bytes]] = []
        self._owed_bytes = 0
        #: The current batch's span and its trace headers (None: untraced, or no batch
        #: open): one span per `CONFIRM_BATCH` chunks, not one per chunk (`worker.tracing`).
        self._batch: tracing.Span | None = None
        self._batch_trace: Mapping[str, str] = _UNTRACED

    @classmethod
    async def open(
        cls,
        publisher: BusPublisher,
        lease: HeldLease,
        *,
        action_id: str,
        endpoint_id: str,
        metrics: Metrics | None = None,
        leases: LeaseStore | None = None,
        operator: bool = False,
    ) -> ChunkStream:
        """The stream at seq 0, or, after a takeover, continued where the chain's recorded
        head and the earlier owners' MAC-proven chunks end (`chunk_chain.continue_chain`):
        gap-free, and never linked to a chunk forged on the subject."""
        first_seq, prev_sha256, stream_seq = 0, None, 0
        if lease.is_takeover and leases is not None:
            record = await leases.chunk_chain(lease.keys)
            start = await continue_chain(
                publisher, record, endpoint_id=endpoint_id, action_id=action_id,
                fence=lease.fence,
            )
            first_seq, prev_sha256, stream_seq = (
                start.next_seq, start.prev_sha256, start.stream_seq
            )
        return cls(
            publisher,
            lease,
            action_id=action_id,
            endpoint_id=endpoint_id,
            first_seq=first_seq,
            prev_sha256=prev_sha256,
            metrics=metrics,
            leases=leases,
            head_stream_seq=stream_seq,
            operator=operator,
        )

    def encode(self, chunk: StreamChunk) -> bytes:
        """The wire bytes of one of this stream's chunks (`worker.wire.chunks`): the same
        chunk always gives the same bytes, so a re-send or a record hashes alike."""
        return self._framer.encode(chunk)

    def _mac(self, data: bytes, sha256: str | None = None) -> str | None:
        """The chain MAC of a chunk's bytes under this delivery's key (None without one)."""
        key = self.lease.chain_key
        if not key:
            return None
        return chain_mac(key, self.lease.fence, sha256 or hashlib.sha256(data).hexdigest())

    @property
    def next_seq(self) -> int:
        return self._seq

    @property
    def awaiting_confirmation(self) -> int:
        """Chunks kept until their confirmation is seen (fewer than `PRUNE_EVERY`, or than
        twice those still unconfirmed at the last prune)."""
        return len(self._pending)

    def _make(
        self,
        kind: ChunkKind,
        payload: Any,
        *,
        provider_event: str | None = None,
        run_id: str | None = None,
    ) -> StreamChunk:
        seq = self._seq
        self._seq += 1
        return make_chunk(
            kind,
            action_id=self.action_id,
            endpoint_id=self.endpoint_id,
            seq=seq,
            ts_unix_ms=now_ms(),
            payload=payload,
            provider_event=provider_event,
            run_id=run_id,
            prev_sha256=self._prev_sha256,
        )

    async def emit(
        self,
        kind: ChunkKind,
        payload: Any = None,
        *,
        provider_event: str | None = None,
        run_id: str | None = None,
    ) -> int:
        """Publish the next chunk and return its seq; raises LeaseLost when the lease may
        have passed to another worker, ConnectorError when the bus refused the chunk.

        A terminal kind is held for after the settle; only the first counts, so a second
        `done`/`error` never leaves a gap in the sequence."""
        self.lease.check()
        if kind is ChunkKind.DONE or kind is ChunkKind.ERROR:  # TERMINAL_KINDS, unhashed
            if self._terminal is None:
                self._terminal = self._make(
                    kind, payload, provider_event=provider_event, run_id=run_id
                )
            return self._terminal.seq
        chunk = self._make(kind, payload, provider_event=provider_event, run_id=run_id)
        # Framed from the facts just given (the chunk's `kind` property rebuilds the enum).
        data = self._framer.frame(
            kind,
            seq=chunk.seq,
            ts_unix_ms=chunk.ts_unix_ms,
            payload=payload,
            provider_event=provider_event,
            run_id=run_id,
            prev_sha256=chunk.prev_sha256,
        )
        sha = self._prev_sha256 = hashlib.sha256(data).hexdigest()
        if self._owed:
            # Held: an earlier chunk is waiting for the bus, and nothing may overtake it.
            self._hold([(chunk, data)])
        else:
            if self._since_collect == 0 and self._batch is None:
                self._open_batch()
            try:
                future = await self.publisher.chunk(
                    chunk,
                    data,
                    subject=self._subject,
                    sha256=sha,
                    mac=self._mac(data, sha),
                    trace=self._batch_trace,
                )
            except Exception as exc:
                self._refused(chunk.seq, exc)
                self._hold([(chunk, data)])
            else:
                self._pending.append((chunk, future))
                self._since_collect += 1
                if len(self._pending) >= self._prune_at:
                    self._prune()
                    # The next scan waits until the list has doubled: when confirmations lag
                    # (a flood), a scan every PRUNE_EVERY chunks over hundreds of unconfirmed
                    # ones was 7% of the relay's CPU; this way each chunk is looked at a
                    # bounded number of times, and a slow run still keeps fewer than
                    # PRUNE_EVERY.
                    self._prune_at = max(PRUNE_EVERY, 2 * len(self._pending))
        if self.metrics is not None:
            self.metrics.chunk_published(self.endpoint_id, kind._value_)
        if self._since_collect >= CONFIRM_BATCH:
            await self._collect()
        return chunk.seq

    def _prune(self) -> None:
        """Let go of the chunks confirmed already: nothing left to wait for or re-send. The
        rest keep their order, so a failed one is still re-sent in seq order later. The
        chunk just before the first unconfirmed one (the list is in seq order, and every
        chunk before that one is confirmed) is stored with every chunk before it: the new
        frontier, found by bisection (a walk back from the newest chunk to it was ~2% of
        the relay's samples when confirmations lag)."""
        pending = self._pending
        kept = [p for p in pending if not confirmed(p[1])]
        first_open = bisect.bisect_left(pending, kept[0][0].seq, key=_seq) if kept else len(pending)
        if first_open:
            self._frontier = pending[first_open - 1]
        self._pending = kept

    async def _collect(self) -> None:
        """Settle the oldest chunks whose confirmations have arrived, without waiting for
        the newer ones; wait only for chunks still unconfirmed `MAX_UNCONFIRMED` seqs later
        (then for every chunk older than the newest `MAX_UNCONFIRMED - CONFIRM_BATCH`).

        Seqs, not the list's length, measure age: confirmed chunks are let go on the way
        (`PRUNE_EVERY`), so the list holds little more than the unconfirmed ones. The
        settled prefix goes through `_confirm_oldest` all the same, so a chunk whose
        publication failed is re-sent (same Msg-Id) here, long before the Action settles,
        or held back with everything after it while the bus refuses it.
        """
        pending = self._pending
        settled = 0
        for _, future in pending:
            if not future.done():
                break
            settled += 1
        if settled < len(pending) and self._seq - pending[settled][0].seq >= MAX_UNCONFIRMED:
            cutoff = self._seq - (MAX_UNCONFIRMED - CONFIRM_BATCH)
            settled = sum(1 for chunk, _ in pending if chunk.seq < cutoff)
        if settled:
            await self._confirm_oldest(settled)
        if self._frontier is not None:
            await self._record(self._frontier)
        self._close_batch()
        self._prune_at = max(PRUNE_EVERY, 2 * len(self._pending))

    def _open_batch(self) -> None:
        """A producer span for the chunks up to the next collect (nothing when untraced)."""
        if not tracing.enabled():
            return
        template = tracing.subject_template(self._subject)
        self._batch = tracing.start(
            f"publish {template}",
            kind="producer",
            attributes=tracing.messaging(
                "publish",
                self._subject,
                template,
                {"aip.action_id": self.action_id, "aip.chunk.first_seq": self._seq},
            ),
        )
        self._batch_trace = tracing.headers_of(self._batch) or _UNTRACED

    def _close_batch(self) -> None:
        """End the batch span, counting what it published; the next chunk opens another."""
        tracing.end(
            self._batch, attributes={"messaging.batch.message_count": self._since_collect}
        )
        self._batch, self._batch_trace = None, _UNTRACED
        self._since_collect = 0

    async def confirm(self) -> None:
        """Wait for the confirmations of every chunk sent so far, then send the chunks held
        back once more. What the bus still refuses stays `owed`: the settle stores it with
        the result and the `Outbox` publishes it before the terminal chunk (a full
        JetStream store must not turn a finished turn into a failure)."""
        await self._confirm_oldest(len(self._pending))
        self._close_batch()
        self._prune_at = PRUNE_EVERY
        if self._owed:
            await self._send_owed()

    async def _confirm_oldest(self, count: int) -> None:
        """Confirm the oldest `count` chunks sent: one wait for all of them (at most the
        publisher's confirm timeout), then each chunk still unconfirmed is sent once more,
        awaited (same Msg-Id). A chunk the bus refuses again is held back, with every chunk
        sent after it, until `confirm` (the stream's order is its seq order)."""
        pending = self._pending
        head = pending[:count]
        waiting = [future for _, future in head if not future.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=self.publisher.confirm_timeout_s)
        for index, (chunk, future) in enumerate(head):
            if confirmed(future):
                continue
            first = None if not future.done() or future.cancelled() else future.exception()
            future.cancel()
            if first is not None:
                self._refused(chunk.seq, first)
            data = self.encode(chunk)
            try:
                await self.publisher.chunk_once(
                    chunk, data, subject=self._subject, mac=self._mac(data)
                )
            except Exception as exc:
                self._refused(chunk.seq, exc)
                held, self._pending = pending[index:], []
                for _, later in held:
                    later.cancel()
                self._owed, owed, self._owed_bytes = [], self._owed, 0
                self._hold([(c, self.encode(c)) for c, _ in held] + owed)
                return
        if head and not self._owed:
            self._frontier = head[-1]
        del pending[:count]

    async def _send_owed(self) -> None:
        """Publish the held chunks again, in order; keep the ones not confirmed in time."""
        sent: list[asyncio.Future[PubAck]] = []
        for chunk, data in self._owed:
            try:
                sent.append(
                    await self.publisher.chunk(
                        chunk, data, subject=self._subject, mac=self._mac(data)
                    )
                )
            except Exception as exc:
                self.publisher.health.failed(exc)
                break
        if sent:
            await asyncio.wait(sent, timeout=self.publisher.confirm_timeout_s)
        stored = 0
        for future in sent:
            if not confirmed(future):
                break
            stored += 1
        for future in sent[stored:]:
            if future.done() and not future.cancelled() and future.exception() is not None:
                self.publisher.health.failed(future.exception())  # type: ignore[arg-type]
            future.cancel()
        if stored:
            self.publisher.health.succeeded()
            del self._owed[:stored]
            self._owed_bytes = sum(len(data) for _, data in self._owed)

    async def _record(self, last: tuple[StreamChunk, asyncio.Future[PubAck]]) -> None:
        """Record `last` (stored, with every chunk before it) as the chain's head, fenced
        (`LeaseStore.record_chunk_head`).

        A refusal means the lease passed to another owner: the stream stops here. A store
        error is logged and the run goes on: a takeover then reads further back on the
        subject (the chain MACs still tell this owner's chunks from forgeries)."""
        chunk, future = last
        if self.leases is None or chunk.seq <= self._recorded_seq:
            return
        if confirmed(future):
            self._head_stream_seq = future.result().seq or self._head_stream_seq
        sha = hashlib.sha256(self.encode(chunk)).hexdigest()
        head = ChunkHead(chunk.seq, sha, self._head_stream_seq)
        lease = self.lease
        try:
            recorded = await self.leases.record_chunk_head(
                lease.keys, lease.owner, lease.fence, head
            )
        except Exception as exc:
            log.warning(
                "chunk chain head of %s not recorded: %s", self.action_id, type(exc).__name__
            )
            return
        if not recorded:
            raise lease.lose("the lease passed to another owner (chunk head refused)")
        self._recorded_seq = chunk.seq

    def _refused(self, seq: int, exc: BaseException) -> None:
        """A chunk's publication failed: `stream_publication` when the stream's own limits
        refused it (waiting cannot help); else the bus is failing, which `/ready` reports,
        and the chunk is held back."""
        if refused_by_stream(exc):
            raise ConnectorError(
                ErrorCode.STREAM_PUBLICATION,
                f"chunk {seq} refused by the chunk stream: "
                f"{str(getattr(exc, 'description', '') or type(exc).__name__)[:200]}",
            ) from None
        self.publisher.health.failed(exc)

    def _hold(self, chunks: list[tuple[StreamChunk, bytes]]) -> None:
        """Keep `chunks` for a later publication, within `OWED_MAX_BYTES`; past it the
        durable sequence has stopped for good (`stream_publication`, as the spec says)."""
        self._owed.extend(chunks)
        self._owed_bytes += sum(len(data) for _, data in chunks)
        if self._owed_bytes > OWED_MAX_BYTES:
            held = len(self._owed)
            self._owed, self._owed_bytes = [], 0
            raise ConnectorError(
                ErrorCode.STREAM_PUBLICATION,
                f"the bus refused {held} chunks (over {OWED_MAX_BYTES} bytes held back); "
                "the chunk stream stops here",
            )

    @property
    def owed(self) -> bytes:
        """The chunks still held back, newline-separated Envelopes, oldest first (b"" for
        none): what the settle stores beside the result (canonical JSON has no raw newline)."""
        return b"\n".join(data for _, data in self._owed)

    def closing(self, kind: ChunkKind, payload: Any) -> StreamChunk:
        """The chunk that closes the stream: the operation's own, or one made from the
        result (`kind` and `payload`)."""
        if self._terminal is None:
            self._terminal = self._make(kind, payload)
        return self._terminal

    @staticmethod
    def replaced(terminal: StreamChunk, payload: Any) -> StreamChunk:
        """An `error` chunk in `terminal`'s place (same seq, time and predecessor): the
        result changed after the terminal chunk was made (it was too large to publish)."""
        return make_chunk(
            ChunkKind.ERROR,
            action_id=terminal.action_id,
            endpoint_id=terminal.endpoint_id,
            seq=terminal.seq,
            ts_unix_ms=terminal.ts_unix_ms,
            payload=payload,
            prev_sha256=terminal.prev_sha256,
        )


def refusal_chunk(
    action_id: str,
    endpoint_id: str,
    error: ProtocolError,
    settled_at_ms: int,
    *,
    start: ChainStart | None = None,
) -> StreamChunk:
    """The terminal chunk of a refused Action, made only from its result's facts: the whole
    stream (one `error` chunk at seq 0) when nothing was published for the Action, else the
    chunk that continues the chain an earlier delivery left (`refusal_start`). The settle
    stores it with the result, so whichever delivery republishes it sends these bytes."""
    return make_chunk(
        ChunkKind.ERROR,
        action_id=action_id,
        endpoint_id=endpoint_id,
        seq=start.next_seq if start is not None else 0,
        prev_sha256=start.prev_sha256 if start is not None else None,
        ts_unix_ms=settled_at_ms,
        payload={"status": ResultStatus.FAILED.value, "error": msgspec.to_builtins(error)},
    )


def replay_chunk(
    action_id: str,
    endpoint_id: str,
    status: ResultStatus,
    error: ProtocolError | None,
    original_action_id: str,
    settled_at_ms: int,
) -> StreamChunk:
    """The whole chunk stream of an Action answered with the result of the Action holding
    its idempotency key: one chunk at seq 0 (`error` for a failure, else `done`) naming
    that Action; the original's chunks stay on its own subject."""
    return make_chunk(
        ChunkKind.ERROR if status is ResultStatus.FAILED else ChunkKind.DONE,
        action_id=action_id,
        endpoint_id=endpoint_id,
        seq=0,
        ts_unix_ms=settled_at_ms,
        payload={
            "status": status.value,
            "error": msgspec.to_builtins(error),
            "original_action_id": original_action_id,
        },
    )


async def refusal_start(
    publisher: BusPublisher,
    leases: LeaseStore,
    keys: ActionKeys,
    *,
    fence: int,
    action_id: str,
    endpoint_id: str,
) -> ChainStart | None:
    """Where a refusal at `fence` continues the Action's chunk chain: None at the first
    fence (nothing was published), else after what earlier deliveries recorded and proved
    (`continue_chain`, as a takeover's `ChunkStream.open`). A refusal after an earlier
    delivery had streamed (a redelivery past the deadline) used to make its terminal chunk
    at seq 0 again, a second chunk at a seq the stream already held, which every reader
    takes for a fork (docs/reliability.md, bug 4)."""
    if fence <= 1:
        return None
    record = await leases.chunk_chain(keys)
    start = await continue_chain(
        publisher, record, endpoint_id=endpoint_id, action_id=action_id, fence=fence
    )
    return start if start.next_seq > 0 else None
