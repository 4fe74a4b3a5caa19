"""Shared pieces of the operation tests: the server handle and an invocation result (the
recording ExecutionContext is `tests.recording.RecordingContext`). Imported by name
(`from ops_harness import …`): this directory is not a package, and a bare `conftest` import
would pick whichever conftest was loaded first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from schemas.action import Action, DelegationRef, Identity, Trace
from schemas.ids import new_action_id
from schemas.result import ResultStatus
from tests.recording import RecordingContext
from worker.endpoints import Endpoint, EndpointDescriptor
from worker.operations.base import Operation, Outcome
from worker.secret_files import Secret
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
