"""One Action in flight on this worker: the concrete `ExecutionContext` of docs/architecture.md §4.

It joins what an executing operation may use: the Action and its endpoint, the lease it
runs under (`worker.execution.leases.HeldLease`: fence facts, the local validity check, the loss),
its chunk stream (`worker.execution.chunk_stream.ChunkStream`: the sequence, the hash chain, the one
terminal chunk), the stores, the cancel signal and the JetStream messages to ack.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg

from schemas.action import Action
from worker.endpoints import Endpoint
from worker.execution.cancel_signal import CancelSignal
from worker.execution.leases import HeldLease
from worker.hermes.http_client import HermesClient
from worker.metrics import FenceStep, Metrics
from worker.operations.base import Operation
from worker.store.clock import now_ms
from worker.store.keys import ActionKeys

if TYPE_CHECKING:
    from worker.execution.chunk_stream import ChunkStream
    from worker.store.stores import Stores


class Execution:
    """Everything about one leased Action that its operation and the heartbeat share."""

    def __init__(
        self,
        *,
        action: Action,
        endpoint: Endpoint,
        operation: Operation,
        hermes: HermesClient,
        lease: HeldLease,
        chunks: ChunkStream,
        worker_id: str,
        deadline_ms: int,
        stores: Stores,
        msg: Msg,
        trusted_headers: Mapping[str, str],
        cancel_requested: bool,
        metrics: Metrics | None = None,
    ) -> None:
        self.action = action
        self.endpoint = endpoint
        self.operation = operation
        self.hermes = hermes
        self.lease = lease
        self.chunks = chunks
        #: Publish the next chunk (`ExecutionContext.emit`): the stream's own method, not a
        #: forwarding coroutine per chunk.
        self.emit = chunks.emit
        self.worker_id = worker_id
        self.stores = stores
        self.metrics = metrics
        self.messages: list[Msg] = [msg]
        self.cancel_requested = CancelSignal()
        if cancel_requested:
            self.cancel_requested.set()
        self.task: asyncio.Task[Any] | None = None
        self._deadline_ms = deadline_ms
        self._headers = dict(trusted_headers)

    # --- ExecutionContext -------------------------------------------------------------

    @property
    def keys(self) -> ActionKeys:
        return self.lease.keys

    @property
    def owner(self) -> str:
        return self.lease.owner

    @property
    def fence(self) -> int:
        return self.lease.fence

    @property
    def is_takeover(self) -> bool:
        return self.lease.is_takeover

    @property
    def attempted_fence(self) -> int:
        return self.lease.attempted_fence

    @property
    def leased_at_ms(self) -> int:
        return self.lease.leased_at_ms

    @property
    def next_seq(self) -> int:
        return self.chunks.next_seq

    def deadline_unix_ms(self) -> int:
        return self._deadline_ms

    def remaining_s(self) -> float:
        return max(0.0, (self._deadline_ms - now_ms()) / 1000)

    def trusted_headers(self) -> Mapping[str, str]:
        return self._headers

    async def mark_unsafe_attempt(self) -> None:
        lease = self.lease
        lease.check()
        if not await self.stores.leases.mark_attempt(lease.keys, lease.owner, lease.fence):
            if self.metrics is not None:
                self.metrics.fenced_out(self.endpoint.id, FenceStep.UNSAFE_ATTEMPT)
            raise lease.lose("lease lost before an unsafe provider request")

    # --- runtime side -----------------------------------------------------------------

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
