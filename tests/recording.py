"""The runtime's `ExecutionContext` without NATS: what an operation emits is recorded in order.

The one context for every test that runs an operation directly (tests/operations,
tests/operator, the stream-terminal tests). Chunks are numbered from `first_seq` as the
runtime numbers them across a takeover; the provider headers are the production projection
(`worker.trust.projection`) of the Action's identity, not a copy of it; unsafe-attempt marks
are counted, so a test can see whether an operation asked the runtime to fence its request
or fenced it itself. Lease facts (`keys`, `owner`, `fence`, ...) default to a first delivery
and are given by tests that hold a real lease.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.action import Action
from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from worker.endpoints import Endpoint
from worker.execution.cancel_signal import CancelSignal
from worker.execution.chunk_stream import TERMINAL_KINDS
from worker.hermes.http_client import HermesClient
from worker.store.keys import ActionKeys
from worker.store.stores import Stores
from worker.trust.identities import TrustedIdentity
from worker.trust.projection import trusted_projection


@dataclass
class RecordingContext:
    """An ExecutionContext that records chunks instead of publishing them."""

    action: Action
    endpoint: Endpoint
    #: None where the test feeds the operation's event stream itself.
    hermes: HermesClient | None = None
    #: The Action's keys (default: its own, as for an Action that is no resume).
    keys: ActionKeys | None = None
    #: The worker's stores (None for an operation that keeps no state in Redis).
    stores: Stores | None = None
    worker_id: str = "worker-test"
    owner: str = "owner-test"
    fence: int = 1
    is_takeover: bool = False
    attempted_fence: int = 0
    #: The seq of the first chunk this delivery emits (an earlier owner's count).
    first_seq: int = 0
    #: Redis time of the lease acquire, as the runtime's Execution carries it.
    leased_at_ms: int = 0
    cancel_requested: CancelSignal = field(default_factory=CancelSignal)
    chunks: list[StreamChunk] = field(default_factory=list)
    #: How many times the operation asked the runtime to record an unsafe attempt.
    unsafe_attempts: int = 0

    def __post_init__(self) -> None:
        if self.keys is None:
            self.keys = ActionKeys.of(self.action.id)

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.chunks)

    def deadline_unix_ms(self) -> int:
        return self.action.deadline_unix_ms or 0

    def remaining_s(self) -> float:
        return max(0.0, (self.deadline_unix_ms() - time.time() * 1000) / 1000)

    def trusted_headers(self) -> Mapping[str, str]:
        claimed = self.action.identity
        identity = TrustedIdentity(
            principal_id=claimed.principal_id,
            revision=claimed.credential_revision or 0,
            tenant_id=claimed.tenant_id,
            principal_kind=claimed.principal_kind,
            authentication_issuer=claimed.authentication_issuer,
        )
        return trusted_projection(self.action, identity, deadline_unix_ms=self.deadline_unix_ms())

    async def emit(
        self,
        kind: ChunkKind,
        payload: Any = None,
        *,
        provider_event: str | None = None,
        run_id: str | None = None,
    ) -> int:
        """Record the next chunk; like the runtime's chunk stream, only the first terminal
        chunk counts (a later one is dropped and answered with the first's seq)."""
        terminal = next((c for c in self.chunks if c.kind in TERMINAL_KINDS), None)
        if terminal is not None and kind in TERMINAL_KINDS:
            return terminal.seq
        seq = self.next_seq
        self.chunks.append(
            make_chunk(
                kind,
                action_id=self.action.id,
                endpoint_id=self.endpoint.id,
                seq=seq,
                ts_unix_ms=int(time.time() * 1000),
                payload=payload,
                provider_event=provider_event,
                run_id=run_id,
            )
        )
        return seq

    async def mark_unsafe_attempt(self) -> None:
        self.unsafe_attempts += 1

    def kinds(self) -> list[ChunkKind]:
        return [chunk.kind for chunk in self.chunks]

    def seqs(self) -> list[int]:
        return [chunk.seq for chunk in self.chunks]
