"""Shared pieces of the operator tests: a small harness around leased recording contexts.

Imported by name (`from operator_support import …`): this directory is not a package. Every
context (`tests.recording.RecordingContext`) holds a real lease from the project's LeaseStore
on the test's redis-server, so the binding scripts' fence checks run exactly as they do under
the runtime.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from schemas.action import Action, DelegationRef, Identity
from schemas.codec import convert_input
from schemas.ids import new_action_id
from schemas.operator import OperatorInput
from schemas.result import ResultStatus
from tests.recording import RecordingContext
from worker.endpoints import Endpoint, EndpointDescriptor
from worker.errors import ConnectorError, LeaseLost
from worker.hermes.http_client import HermesClient
from worker.operations.base import Outcome
from worker.operator.binding import OperatorBinding, decode_binding
from worker.operator.operation import OperatorOperation
from worker.operator.policy import HermesOperatorPolicy
from worker.secret_files import Secret
from worker.store.keys import ActionKeys, binding_key
from worker.store.lease_store import AcquireStatus, LeaseStore
from worker.store.operator_store import OperatorStore
from worker.store.stores import Stores
from worker.testing.fake_hermes import FakeConfig, upstream
from worker.testing.services import eventually

ENDPOINT_ID = "hermes-1"
LEASE_TTL_MS = 120_000


def fake_config(**changes: object) -> FakeConfig:
    """Hermes 0.19 behaviour with test-sized timers."""
    base = {
        "api_key": secrets.token_urlsafe(32),
        "missing_stream_delay_s": 0.05,
        "build_delay_s": 0.02,
        "keepalive_s": 5.0,
    }
    base.update(changes)
    return FakeConfig(**base)  # type: ignore[arg-type]


#: Both Hermes behaviours, for the modules that must hold against each: 0.19, and upstream
#: after 0.19 (durable run keys, `interrupted`, `run_not_active`, approval request ids).
BOTH_HERMES = pytest.mark.parametrize(
    "fake_settings",
    [
        pytest.param(fake_config(), id="hermes-0.19"),
        pytest.param(upstream(fake_config()), id="hermes-upstream"),
    ],
)


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
class Harness:
    """One redis-server + one Hermes endpoint + the operator under one policy."""

    redis: Any
    hermes: HermesClient
    policy: HermesOperatorPolicy
    operation: OperatorOperation = field(init=False)
    stores: Stores = field(init=False)
    leases: LeaseStore = field(init=False)
    store: OperatorStore = field(init=False)

    def __post_init__(self) -> None:
        self.operation = OperatorOperation(self.policy)
        self.stores = Stores.over(self.redis)
        self.leases = self.stores.leases
        self.store = self.stores.operator

    def with_policy(self, **changes: Any) -> Harness:
        return Harness(self.redis, self.hermes, replace(self.policy, **changes))

    def action(self, input_value: dict[str, Any], **kwargs: Any) -> Action:
        return make_action(input_value, endpoint_id=self.hermes.endpoint.id, **kwargs)

    async def lease(
        self, action: Action, *, owner: str | None = None, first_seq: int = 0
    ) -> RecordingContext:
        """Acquire the Action's lease (a new delivery attempt) and build its context."""
        source = None
        resume_input = action.input.get("resume")
        if isinstance(resume_input, dict):
            source = resume_input.get("source_action_id")
        keys = ActionKeys.of(action.id, source_action_id=source)
        token = owner or "own-" + secrets.token_hex(8)
        grant = await self.leases.acquire(keys, token, LEASE_TTL_MS, "fp-" + action.id)
        assert grant.status is AcquireStatus.ACQUIRED, grant
        return RecordingContext(
            action=action,
            endpoint=self.hermes.endpoint,
            hermes=self.hermes,
            keys=keys,
            stores=self.stores,
            owner=token,
            fence=grant.fence,
            is_takeover=grant.is_takeover,
            first_seq=first_seq,
            leased_at_ms=grant.now_ms,
        )

    async def replace_owner(
        self, ctx: RecordingContext, *, action: Action | None = None
    ) -> RecordingContext:
        """Process replacement: the old owner's lease ends, a new delivery takes over
        (of the same Action, or of `action`: the same id redelivered with other content)."""
        await self.leases.release(ctx.keys, ctx.owner, ctx.fence)
        return await self.lease(action or ctx.action, first_seq=ctx.next_seq)

    async def execute(self, ctx: RecordingContext) -> Outcome:
        """What the runtime does around `execute` (a ConnectorError is a failed outcome)."""
        params = convert_input(ctx.action.input, OperatorInput)
        try:
            outcome = await self.operation.execute(ctx, params)
        except ConnectorError as exc:
            outcome = Outcome(ResultStatus.FAILED, None, exc)
        # The operator fences its own start (the start claim), never through the runtime.
        assert ctx.unsafe_attempts == 0, "the operator asked the runtime to mark an attempt"
        return outcome

    async def run(self, action: Action) -> tuple[Outcome, RecordingContext]:
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
    await eventually(predicate, within=timeout_s, what="the condition", poll=step_s)
