"""One Action in flight on this worker: the concrete `ExecutionContext` of docs/architecture.md §4.

It owns the chunk sequence, the pending chunk confirmations, the lease facts the heartbeat
keeps current, and the local lease-validity check that stops a paused-then-resumed worker
from publishing anything after its lease may have passed to someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Mapping
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import PubAck

from schemas.action import Action
from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from schemas.codec import encode
from schemas.errors import ErrorCode
from worker.endpoints import Endpoint
from worker.errors import ConnectorError
from worker.hermes.http_client import HermesClient
from worker.metrics import FenceStep, Metrics
from worker.operations.base import LeaseLost, Operation
from worker.publisher import BusPublisher
from worker.store.keys import ActionKeys
from worker.stores import Stores

#: Share of the lease TTL after the last confirmed renewal during which this worker still
#: trusts it holds the lease. The margin covers clock-rate drift and the renewal round trip.
LOCAL_VALIDITY = 0.8

_TERMINAL_KINDS = (ChunkKind.DONE, ChunkKind.ERROR)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Execution:
    """Everything about one leased Action that its operation and the heartbeat share."""

    def __init__(
        self,
        *,
        action: Action,
        endpoint: Endpoint,
        operation: Operation,
        hermes: HermesClient,
        keys: ActionKeys,
        worker_id: str,
        owner: str,
        fence: int,
        is_takeover: bool,
        attempted_fence: int,
        first_seq: int,
        deadline_ms: int,
        lease_ttl_ms: int,
        stores: Stores,
        publisher: BusPublisher,
        msg: Msg,
        trusted_headers: Mapping[str, str],
        cancel_requested: bool,
        metrics: Metrics | None = None,
        leased_at_ms: int = 0,
        prev_sha256: str | None = None,
    ) -> None:
        self.metrics = metrics
        #: Redis time at which this delivery acquired its lease (0: unknown).
        self.leased_at_ms = leased_at_ms
        self.action = action
        self.endpoint = endpoint
        self.operation = operation
        self.hermes = hermes
        self.keys = keys
        self.worker_id = worker_id
        self.owner = owner
        self.fence = fence
        self.is_takeover = is_takeover
        self.attempted_fence = attempted_fence
        self.stores = stores
        self.publisher = publisher
        self.messages: list[Msg] = [msg]
        self.cancel_requested = asyncio.Event()
        if cancel_requested:
            self.cancel_requested.set()
        self.lease_lost = False
        #: The keeper counted and logged the loss (once, whichever check found it first).
        self.loss_reported = False
        #: The owner is settling or releasing the lease: from now on a renewal refused is
        #: that, not a loss (the settle's own answer tells a real one).
        self.ending = False
        self.task: asyncio.Task[Any] | None = None
        self._seq = first_seq
        #: Hash of the last chunk published for this Action (by this worker, or by the one
        #: before a takeover, read back from the stream): the next chunk names it.
        self._prev_sha256 = prev_sha256
        self._deadline_ms = deadline_ms
        self._lease_ttl_s = lease_ttl_ms / 1000
        #: Monotonic time at which the last *successful* renewal was sent (acquire counts).
        self.renewed_at = time.monotonic()
        self._pending: list[tuple[StreamChunk, asyncio.Future[PubAck]]] = []
        self._headers = dict(trusted_headers)
        #: A terminal chunk the operation asked for; published by the runtime after settle.
        self.terminal: StreamChunk | None = None

    # --- ExecutionContext -------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        return self._seq

    def deadline_unix_ms(self) -> int:
        return self._deadline_ms

    def remaining_s(self) -> float:
        return max(0.0, (self._deadline_ms - now_ms()) / 1000)

    def trusted_headers(self) -> Mapping[str, str]:
        return self._headers

    async def emit(
        self,
        kind: ChunkKind,
        payload: Any = None,
        *,
        provider_event: str | None = None,
        run_id: str | None = None,
    ) -> int:
        self.ensure_lease()
        seq = self._seq
        self._seq += 1
        chunk = make_chunk(
            kind,
            action_id=self.action.id,
            endpoint_id=self.endpoint.id,
            seq=seq,
            ts_unix_ms=now_ms(),
            payload=payload,
            provider_event=provider_event,
            run_id=run_id,
            prev_sha256=self._prev_sha256,
        )
        if kind in _TERMINAL_KINDS:
            # The terminal chunk goes out after the fenced settle
            # (docs/architecture.md §4, steps 6-7).
            self.terminal = chunk
            return seq
        data = encode(chunk)
        self._prev_sha256 = hashlib.sha256(data).hexdigest()
        try:
            future = await self.publisher.chunk(chunk, data)
        except Exception as exc:
            raise ConnectorError(
                ErrorCode.STREAM_PUBLICATION, f"chunk {seq} not published: {type(exc).__name__}"
            ) from None
        self._pending.append((chunk, future))
        if self.metrics is not None:
            self.metrics.chunk_published(self.endpoint.id, kind.value)
        if len(self._pending) >= 256:
            await self.confirm_chunks()
        return seq

    async def mark_unsafe_attempt(self) -> None:
        self.ensure_lease()
        if not await self.stores.leases.mark_attempt(self.keys, self.owner, self.fence):
            if self.metrics is not None:
                self.metrics.fenced_out(self.endpoint.id, FenceStep.UNSAFE_ATTEMPT)
            self.lease_lost = True
            raise LeaseLost("lease lost before an unsafe provider request")

    # --- runtime side -----------------------------------------------------------------

    def ensure_lease(self) -> None:
        """Raise LeaseLost unless a renewal confirmed the lease recently enough.

        A worker paused past its TTL (SIGSTOP, a long GC, a frozen VM) resumes here with a
        stale `renewed_at` and stops before it publishes or sends anything.
        """
        if self.lease_lost or (
            time.monotonic() - self.renewed_at > self._lease_ttl_s * LOCAL_VALIDITY
        ):
            self.lease_lost = True
            raise LeaseLost("lease not confirmed within its TTL")

    async def confirm_chunks(self) -> None:
        pending, self._pending = self._pending, []
        try:
            await self.publisher.confirm(pending)
        except Exception as exc:
            raise ConnectorError(
                ErrorCode.STREAM_PUBLICATION, f"chunks not confirmed: {exc}"
            ) from None

    def terminal_chunk(
        self, kind: ChunkKind, payload: Any, provider_event: str | None
    ) -> StreamChunk:
        """The chunk that closes the stream: the operation's own, or one made from the result."""
        if self.terminal is not None:
            return self.terminal
        seq = self._seq
        self._seq += 1
        return make_chunk(
            kind,
            action_id=self.action.id,
            endpoint_id=self.endpoint.id,
            seq=seq,
            ts_unix_ms=now_ms(),
            payload=payload,
            provider_event=provider_event,
            prev_sha256=self._prev_sha256,
        )

    def log_fields(self) -> dict[str, object]:
        """Structured context for log records about this Action (see worker.logs)."""
        trace = self.action.trace
        return {
            "action_id": self.action.id,
            "endpoint": self.endpoint.id,
            "capability": self.action.capability,
            "fence": self.fence,
            "trace_id": trace.trace_id if trace else None,
            "worker_id": self.worker_id,
        }

    async def in_progress(self) -> None:
        """Tell JetStream the delivery is alive (buffered, no flush: ~700k/s here)."""
        for msg in self.messages:
            with contextlib.suppress(Exception):  # a lost signal only shortens AckWait
                await msg.in_progress()
