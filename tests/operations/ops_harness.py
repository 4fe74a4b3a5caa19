"""Shared pieces of the operation tests: the server handle, a recording ExecutionContext,
and an invocation result. Imported by name (`from ops_harness import …`): `tests/` is not a
package, and a bare `conftest` import would pick whichever conftest was loaded first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from schemas.action import Action, DelegationRef, Identity, Trace
from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from schemas.ids import new_action_id
from schemas.result import ResultStatus
from worker.endpoints import Endpoint, EndpointDescriptor
from worker.hermes.http_client import HermesClient
from worker.operations.base import Operation, Outcome
from worker.secret_files import Secret
from worker.store.keys import ActionKeys
from worker.testing.fake_hermes import FakeHermes

ENDPOINT_ID = "hermes-1"


@dataclass(frozen=True)
class HermesServer:
    """One server under test; `fake` is None for the real Hermes."""

    kind: str
    url: str
    api_key: str
    fake: FakeHermes | None

    def require_fake(self) -> FakeHermes:
        if self.fake is None:
            pytest.skip("fake-only: needs the fake's faults or request log")
        return self.fake


def endpoint_for(url: str, api_key: str | None, **descriptor: Any) -> Endpoint:
    return Endpoint(
        descriptor=EndpointDescriptor(id=ENDPOINT_ID, url=url, **descriptor),
        api_key=None if api_key is None else Secret(api_key),
    )


@dataclass
class RecordingContext:
    """An ExecutionContext that records chunks; enough to run any non-operator operation."""

    action: Action
    endpoint: Endpoint
    hermes: HermesClient
    deadline_ms: int
    keys: ActionKeys = field(init=False)
    worker_id: str = "worker-test"
    owner: str = "owner-test"
    fence: int = 1
    is_takeover: bool = False
    attempted_fence: int = 0
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)
    redis: Any = None
    chunks: list[StreamChunk] = field(default_factory=list)
    unsafe_attempts: int = 0

    def __post_init__(self) -> None:
        self.keys = ActionKeys.of(self.action.id)

    @property
    def next_seq(self) -> int:
        return len(self.chunks)

    def deadline_unix_ms(self) -> int:
        return self.deadline_ms

    def remaining_s(self) -> float:
        return (self.deadline_ms - time.time() * 1000) / 1000

    def trusted_headers(self) -> Mapping[str, str]:
        a = self.action
        headers = {
            "X-AIP-Principal-Id": a.identity.principal_id,
            "X-AIP-Deadline-Unix-Ms": str(self.deadline_ms),
        }
        if a.identity.tenant_id:
            headers["X-AIP-Tenant-Id"] = a.identity.tenant_id
        if a.identity.authentication_issuer:
            headers["X-AIP-Authentication-Issuer"] = a.identity.authentication_issuer
        if a.trace and a.trace.trace_id:
            headers["X-AIP-Trace-Id"] = a.trace.trace_id
        if a.trace and a.trace.correlation_id:
            headers["X-AIP-Correlation-Id"] = a.trace.correlation_id
        if a.delegation and a.delegation.chain:
            headers["X-AIP-Delegation-Chain"] = ",".join(a.delegation.chain)
        if a.idempotency_key:
            headers["Idempotency-Key"] = a.idempotency_key
        return headers

    async def emit(
        self,
        kind: ChunkKind,
        payload: Any = None,
        *,
        provider_event: str | None = None,
        run_id: str | None = None,
    ) -> int:
        seq = len(self.chunks)
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


@dataclass
class Invocation:
    """What one operation call ended with (a raised ConnectorError becomes a failed outcome)."""

    outcome: Outcome
    ctx: RecordingContext
    operation: Operation

    @property
    def status(self) -> ResultStatus:
        return self.outcome.status

    @property
    def output(self) -> Any:
        return self.outcome.output

    def error_code(self) -> str | None:
        return None if self.outcome.error is None else self.outcome.error.code.value

    def protocol_error(self) -> Any:
        assert self.outcome.error is not None
        return self.outcome.error.to_protocol(
            endpoint_id=ENDPOINT_ID, read_only=self.operation.spec.read_only
        )


Invoke = Callable[..., Any]


def make_action(
    operation: str,
    input_value: dict[str, Any],
    *,
    idempotency_key: str | None = None,
    deadline_s: float = 30.0,
) -> Action:
    now_ms = int(time.time() * 1000)
    return Action(
        id=new_action_id(),
        capability=f"cap:hermes_agent:{ENDPOINT_ID}:{operation}",
        input=input_value,
        identity=Identity(
            principal_id="user:alice",
            principal_kind="user",
            tenant_id="tenant-a",
            authentication_issuer="https://issuer.example",
        ),
        created_at_unix_ms=now_ms,
        idempotency_key=idempotency_key,
        deadline_unix_ms=now_ms + int(deadline_s * 1000),
        trace=Trace(trace_id="trace-1", correlation_id="corr-1"),
        delegation=DelegationRef(delegation_id="del-1", chain=["user:alice", "agent:x"]),
    )
