"""The chunks of one Action: the one owner of their sequence and hash chain.

An Action's chunks are `seq` 0, 1, 2, … with no gap, each naming the sha256 of the one
before, and exactly one terminal chunk (`done` or `error`) closing the stream after the
fenced settle (docs/architecture.md §4, steps 5-7). Every decision about that sequence is
made here:

- where it starts: 0 for an Action no worker published for, or, when this delivery took
  the Action over, after the chain's recorded head and the earlier owners' chunks that
  prove they follow it (`open`, `worker.execution.chunk_chain`) — never after whatever is
  last on the subject;
- the record of that head: after each confirmation collection the last confirmed chunk is
  recorded in the lease hash, fenced (`_record`), and every chunk carries its delivery's
  chain MAC;
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
- the whole stream of a refused Action, one terminal chunk at seq 0 made only from its
  result's facts (`refusal_chunk`).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import msgspec

from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from schemas.codec import encode
from schemas.errors import ErrorCode, ProtocolError
from schemas.result import ResultStatus
from worker.bus.publisher import BusPublisher, SentChunk, confirmed
from worker.errors import ConnectorError
from worker.execution.chunk_chain import chain_mac, continue_chain
from worker.execution.leases import HeldLease
from worker.metrics import Metrics
from worker.store.clock import now_ms
from worker.store.lease_store import ChunkHead, LeaseStore

log = logging.getLogger(__name__)

TERMINAL_KINDS = frozenset({ChunkKind.DONE, ChunkKind.ERROR})

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
    ) -> None:
        self.publisher = publisher
        self.lease = lease
        self.action_id = action_id
        self.endpoint_id = endpoint_id
        self.metrics = metrics
        #: Built (and the id checked) once, not for each of thousands of chunks.
        self._subject = publisher.subjects.chunks(endpoint_id, action_id)
        self._seq = first_seq
        #: Hash of the last chunk published for this Action (by this worker, or by the one
        #: before a takeover, read back from the stream): the next chunk names it.
        self._prev_sha256 = prev_sha256
        #: Where the chain's head is recorded (None: nowhere, for a stream no takeover
        #: continues, as in the unit tests of the stream itself).
        self.leases = leases
        #: Stream sequence of the last confirmed chunk (0: none yet): the next record's.
        self._head_stream_seq = head_stream_seq
        #: The chain MAC needs the delivery's key: a lease without one sends none.
        self._chain_key = lease.chain_key
        self._pending: list[SentChunk] = []
        #: The newest chunk known stored with every chunk before it: the head to record.
        self._frontier: SentChunk | None = None
        #: Seq of the head last recorded (-1: none), so an unchanged head is not re-sent.
        self._recorded_seq = -1
        #: Chunks emitted since confirmations were last collected (see `_collect`).
        self._since_collect = 0
        #: `len(_pending)` at which `emit` next lets go of confirmed chunks.
        self._prune_at = PRUNE_EVERY
        #: The terminal chunk the operation emitted, held for after the settle.
        self._terminal: StreamChunk | None = None

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
    ) -> ChunkStream:
        """The stream at seq 0, or, after a takeover, continued where the chain's recorded
        head and the earlier owners' MAC-proven chunks end (`chunk_chain.continue_chain`):
        gap-free, and never linked to a chunk forged on the subject."""
        first_seq, prev_sha256, stream_seq = 0, None, 0
        if lease.is_takeover and leases is not None:
            record = await leases.chunk_chain(lease.keys)
            start = await continue_chain(
                publisher,
                record,
                endpoint_id=endpoint_id,
                action_id=action_id,
                fence=lease.fence,
            )
            first_seq, prev_sha256, stream_seq = (
                start.next_seq,
                start.prev_sha256,
                start.stream_seq,
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
        )

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
        if kind in TERMINAL_KINDS:
            if self._terminal is None:
                self._terminal = self._make(
                    kind, payload, provider_event=provider_event, run_id=run_id
                )
            return self._terminal.seq
        chunk = self._make(kind, payload, provider_event=provider_event, run_id=run_id)
        data = encode(chunk)
        sha = self._prev_sha256 = hashlib.sha256(data).hexdigest()
        key = self._chain_key
        try:
            sent = await self.publisher.chunk(
                chunk,
                data,
                subject=self._subject,
                sha256=sha,
                mac=chain_mac(key, self.lease.fence, sha) if key else None,
            )
        except Exception as exc:
            raise ConnectorError(
                ErrorCode.STREAM_PUBLICATION,
                f"chunk {chunk.seq} not published: {type(exc).__name__}",
            ) from None
        self._pending.append(sent)
        self._since_collect += 1
        if len(self._pending) >= self._prune_at:
            # Confirmed already: nothing left to wait for or re-send. The rest keep their
            # order, so a failed one is still re-sent in seq order by `confirm`.
            kept = [p for p in self._pending if not confirmed(p.future)]
            first_open = kept[0].chunk.seq if kept else self._seq
            for sent in reversed(self._pending):
                if sent.chunk.seq < first_open and confirmed(sent.future):
                    self._frontier = sent  # it and every chunk before it are stored
                    break
            self._pending = kept
            # The next scan waits until the list has doubled: when confirmations lag (a
            # flood), a scan every PRUNE_EVERY chunks over hundreds of unconfirmed ones was
            # 7% of the relay's CPU; this way each chunk is looked at a bounded number of
            # times, and a slow run still keeps fewer than PRUNE_EVERY.
            self._prune_at = max(PRUNE_EVERY, 2 * len(self._pending))
        if self.metrics is not None:
            self.metrics.chunk_published(self.endpoint_id, kind.value)
        if self._since_collect >= CONFIRM_BATCH:
            await self._collect()
        return chunk.seq

    async def _collect(self) -> None:
        """Settle the oldest chunks whose confirmations have arrived, without waiting for
        the newer ones; wait only for chunks still unconfirmed `MAX_UNCONFIRMED` seqs later
        (then for every chunk older than the newest `MAX_UNCONFIRMED - CONFIRM_BATCH`).

        Seqs, not the list's length, measure age: confirmed chunks are let go on the way
        (`PRUNE_EVERY`), so the list holds little more than the unconfirmed ones. The
        settled prefix goes through `confirm` all the same, so a chunk whose publication
        failed is re-sent (same Msg-Id) here, long before the Action settles.
        """
        pending = self._pending
        settled = 0
        for sent in pending:
            if not sent.future.done():
                break
            settled += 1
        if settled < len(pending) and self._seq - pending[settled].chunk.seq >= MAX_UNCONFIRMED:
            cutoff = self._seq - (MAX_UNCONFIRMED - CONFIRM_BATCH)
            settled = sum(1 for sent in pending if sent.chunk.seq < cutoff)
        if settled:
            await self._confirm(pending[:settled])
            self._frontier = pending[settled - 1]
            del pending[:settled]
        if self._frontier is not None:
            await self._record(self._frontier)
        self._since_collect = 0
        self._prune_at = max(PRUNE_EVERY, 2 * len(pending))

    async def confirm(self) -> None:
        """Wait for the confirmations of every chunk sent so far."""
        pending, self._pending = self._pending, []
        self._since_collect = 0
        self._prune_at = PRUNE_EVERY
        await self._confirm(pending)

    async def _record(self, last: SentChunk) -> None:
        """Record `last` (confirmed) as the chain's head, fenced (`LeaseStore.record_chunk_head`).

        A refusal means the lease passed to another owner: the stream stops here. A store
        error is logged and the run goes on: a takeover then reads further back on the
        subject (the chain MACs still tell this owner's chunks from forgeries)."""
        if self.leases is None or last.chunk.seq <= self._recorded_seq:
            return
        if confirmed(last.future):
            self._head_stream_seq = last.future.result().seq or self._head_stream_seq
        head = ChunkHead(
            last.chunk.seq, hashlib.sha256(last.data).hexdigest(), self._head_stream_seq
        )
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
        self._recorded_seq = last.chunk.seq

    async def _confirm(self, pending: list[SentChunk]) -> None:
        try:
            await self.publisher.confirm(pending)
        except Exception as exc:
            raise ConnectorError(
                ErrorCode.STREAM_PUBLICATION, f"chunks not confirmed: {exc}"
            ) from None

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
    action_id: str, endpoint_id: str, error: ProtocolError, settled_at_ms: int
) -> StreamChunk:
    """The whole chunk stream of a refused Action: one `error` chunk at seq 0, made only
    from its result's facts, so the same bytes (and hash) come back whichever delivery
    publishes it."""
    return make_chunk(
        ChunkKind.ERROR,
        action_id=action_id,
        endpoint_id=endpoint_id,
        seq=0,
        ts_unix_ms=settled_at_ms,
        payload={"status": ResultStatus.FAILED.value, "error": msgspec.to_builtins(error)},
    )
