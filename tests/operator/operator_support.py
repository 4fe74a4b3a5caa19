"""Shared pieces of the operator tests: a leased ExecutionContext and a small harness.

Imported by name (`from operator_support import …`): `tests/` is not a package. Every
context holds a real lease from the project's LeaseStore on the test's own redis-server, so
the binding scripts' fence checks run exactly as they do under the runtime.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from schemas.action import Action, DelegationRef, Identity
from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from schemas.codec import convert_input
from schemas.ids import new_action_id
from schemas.operator import OperatorInput
from schemas.result import ResultStatus
from worker.endpoints import Endpoint, EndpointDescriptor
from worker.errors import ConnectorError
from worker.hermes.http_client import HermesClient
from worker.operations.base import LeaseLost, Outcome
from worker.operator.binding import OperatorBinding, decode_binding
from worker.operator.operation import OperatorOperation
from worker.operator.policy import HermesOperatorPolicy
from worker.secret_files import Secret
from worker.store.keys import ActionKeys, binding_key
from worker.store.lease_store import AcquireStatus, LeaseStore
from worker.store.operator_store import OperatorStore

ENDPOINT_ID = "hermes-1"
LEASE_TTL_MS = 120_000


def endpoint_for(url: str, api_key: str, endpoint_id: str = ENDPOINT_ID) -> Endpoint:
    return Endpoint(descriptor=EndpointDescriptor(id=endpoint_id, url=url), api_key=Secret(api_key))


def make_action(
    input_value: dict[str, Any],
    *,
    action_id: str | None = None,
    endpoint_id: str = ENDPOINT_ID,
    deadline_s: float = 30.0,
    delegation: DelegationRef | None = None,
) -> Action:
    now_ms = int(time.time() * 1000)
    return Action(
        id=action_id or new_action_id(),
        capability=f"cap:hermes_agent:{endpoint_id}:operator",
        input=input_value,
        identity=Identity(principal_id="user:alice", principal_kind="user"),
        created_at_unix_ms=now_ms,
        idempotency_key="idem-" + secrets.token_hex(8),
        deadline_unix_ms=now_ms + int(deadline_s * 1000),
        delegation=delegation,
    )


def objective(text: str, **extra: Any) -> dict[str, Any]:
    """An objective input as `schemas.operator.OperatorInput` shapes it."""
    return {"objective": text, **extra}


def resume(source_action_id: str, choice: str = "once", **extra: Any) -> dict[str, Any]:
    return {"resume": {"source_action_id": source_action_id, "choice": choice, **extra}}


@dataclass
class LeasedContext:
    """The runtime's ExecutionContext, minus NATS: chunks are recorded in order."""

    action: Action
    endpoint: Endpoint
    hermes: HermesClient
    keys: ActionKeys
    redis: Any
    owner: str
    fence: int
    is_takeover: bool
    first_seq: int = 0
    worker_id: str = "worker-test"
    attempted_fence: int = 0
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)
    chunks: list[StreamChunk] = field(default_factory=list)
    #: Redis time of the lease acquire, as the runtime's Execution carries it.
    leased_at_ms: int = 0

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.chunks)

    def deadline_unix_ms(self) -> int:
        return self.action.deadline_unix_ms or 0

    def remaining_s(self) -> float:
        return max(0.0, (self.deadline_unix_ms() - time.time() * 1000) / 1000)

    def trusted_headers(self) -> Mapping[str, str]:
        return {
            "X-AIP-Principal-Id": self.action.identity.principal_id,
            "X-AIP-Deadline-Unix-Ms": str(self.deadline_unix_ms()),
            "Idempotency-Key": self.action.idempotency_key or "",
        }

    async def emit(
        self,
        kind: ChunkKind,
        payload: Any = None,
        *,
        provider_event: str | None = None,
        run_id: str | None = None,
    ) -> int:
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
        raise AssertionError("the operator fences itself; the runtime's attempt mark is unused")

    def kinds(self) -> list[ChunkKind]:
        return [chunk.kind for chunk in self.chunks]

    def seqs(self) -> list[int]:
        return [chunk.seq for chunk in self.chunks]


@dataclass
class Harness:
    """One redis-server + one Hermes endpoint + the operator under one policy."""

    redis: Any
    hermes: HermesClient
    policy: HermesOperatorPolicy
    operation: OperatorOperation = field(init=False)
    leases: LeaseStore = field(init=False)
    store: OperatorStore = field(init=False)

    def __post_init__(self) -> None:
        self.operation = OperatorOperation(self.policy)
        self.leases = LeaseStore(self.redis)
        self.store = OperatorStore(self.redis)

    def with_policy(self, **changes: Any) -> Harness:
        return Harness(self.redis, self.hermes, replace(self.policy, **changes))

    def action(self, input_value: dict[str, Any], **kwargs: Any) -> Action:
        return make_action(input_value, endpoint_id=self.hermes.endpoint.id, **kwargs)

    async def lease(
        self, action: Action, *, owner: str | None = None, first_seq: int = 0
    ) -> LeasedContext:
        """Acquire the Action's lease (a new delivery attempt) and build its context."""
        source = None
        resume_input = action.input.get("resume")
        if isinstance(resume_input, dict):
            source = resume_input.get("source_action_id")
        keys = ActionKeys.of(action.id, source_action_id=source)
        token = owner or "own-" + secrets.token_hex(8)
        grant = await self.leases.acquire(keys, token, LEASE_TTL_MS, "fp-" + action.id)
        assert grant.status is AcquireStatus.ACQUIRED, grant
        return LeasedContext(
            action=action,
            endpoint=self.hermes.endpoint,
            hermes=self.hermes,
            keys=keys,
            redis=self.redis,
            owner=token,
            fence=grant.fence,
            is_takeover=grant.is_takeover,
            first_seq=first_seq,
            leased_at_ms=grant.now_ms,
        )

    async def replace_owner(
        self, ctx: LeasedContext, *, action: Action | None = None
    ) -> LeasedContext:
        """Process replacement: the old owner's lease ends, a new delivery takes over
        (of the same Action, or of `action`: the same id redelivered with other content)."""
        await self.leases.release(ctx.keys, ctx.owner, ctx.fence)
        return await self.lease(action or ctx.action, first_seq=ctx.next_seq)

    async def execute(self, ctx: LeasedContext) -> Outcome:
        """What the runtime does around `execute` (a ConnectorError is a failed outcome)."""
        params = convert_input(ctx.action.input, OperatorInput)
        try:
            return await self.operation.execute(ctx, params)
        except ConnectorError as exc:
            return Outcome(ResultStatus.FAILED, None, exc)

    async def run(self, action: Action) -> tuple[Outcome, LeasedContext]:
        ctx = await self.lease(action)
        return await self.execute(ctx), ctx

    async def binding(self, source_action_id: str) -> OperatorBinding | None:
        stored = await self.store.read(binding_key(source_action_id))
        return None if stored.doc is None else decode_binding(stored.doc)

    async def require_binding(self, source_action_id: str) -> OperatorBinding:
        binding = await self.binding(source_action_id)
        assert binding is not None, f"no binding for {source_action_id}"
        return binding


def error_code(outcome: Outcome) -> str | None:
    return None if outcome.error is None else outcome.error.code.value


async def expect_lease_lost(coro: Any) -> None:
    try:
        await coro
    except LeaseLost:
        return
    raise AssertionError("a fenced-out writer was allowed to write")


async def wait_for(predicate: Any, timeout_s: float = 10.0, step_s: float = 0.02) -> None:
    """Poll an async predicate until it holds (fails the test on timeout)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(step_s)
