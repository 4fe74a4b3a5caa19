"""A fake AIP runtime: the `aip_call` MCP tool, the Action queue and the lifecycle store.

First-class delegation ends with the worker reading the child Action's native result from
the runtime's stores (`worker.delegation`). This is the other side of that edge, for tests
and the demo: the tool a Hermes (the fake, through `fake.mcp_tools`) calls as its own
authenticated principal, which records the child in the queue stream, executes it with a
pluggable executor, records the durable result in the lifecycle stream and marks the queue
entry terminal, each record signed with the gateway/runtime seed. `fault` breaks exactly one
invariant the resolver must catch (an altered contract, a forged owner, tenant drift, stores
that disagree, ...), so each refusal has exactly one cause.

```python
runtime = FakeAipRuntime(nc, seed=trust.seed)
await runtime.provision()
fake.mcp_tools["aip_call"] = runtime.tool_for(runtime.principal("h1"))
```
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import msgspec
from msgspec.structs import replace
from nats.aio.client import Client as NATS

from schemas.action import Action, Identity
from schemas.delegation import ACTION_WRITE_SCOPE, DELEGATE_PREFIX, ChildAction
from schemas.ids import new_action_id
from schemas.lifecycle import (
    AuthenticatedPrincipal,
    ChildResult,
    LifecycleRecord,
    LifecycleState,
    QueueRecord,
)
from subjects.grammar import Subjects
from subjects.provision import provision_stream
from subjects.streams import StreamPolicy, runtime_store_configs
from worker.client import AipClient
from worker.testing.fake_hermes.mcp import McpTool
from worker.trust.signing import sign_envelope

#: What the executor returns: (status, output, error) of the child.
ChildOutcome = tuple[str, Any, dict[str, Any] | None]
ChildExecutor = Callable[[ChildAction], Awaitable[ChildOutcome]]

AGENT_KIND = "agent"
ISSUER = "https://aip-mcp.example.test"


class RuntimeFault(StrEnum):
    """One broken invariant at a time (what `verify_child` must refuse, or accept)."""

    NONE = "none"
    #: The tool answers, but no child is ever created (Hermes "did it" in prose only).
    NOT_CREATED = "not_created"
    #: The child is created under a generated id instead of the delegated `action_id`.
    REPLACED_ACTION_ID = "replaced_action_id"
    #: The child's input differs from the delegated contract.
    ALTERED_INPUT = "altered_input"
    #: The runtime adds trusted `_aip` memory enrichment (must still verify).
    MEMORY_ENRICHED = "memory_enriched"
    #: The queue entry is owned by another principal than the delegate.
    FORGED_OWNER = "forged_owner"
    #: The child's identity is not the transport-authenticated one.
    IDENTITY_INTEGRITY = "identity_integrity"
    #: The authentication that created the child has expired.
    EXPIRED_AUTH = "expired_auth"
    #: The authenticated principal lacks `action:write`.
    NO_WRITE_SCOPE = "no_write_scope"
    #: The child lives in another tenant partition.
    TENANT_DRIFT = "tenant_drift"
    #: The creator's tenant membership has expired.
    TENANT_EXPIRED = "tenant_expired"
    #: The queue says completed, the lifecycle failed.
    STORES_DISAGREE = "stores_disagree"
    #: The queue entry is terminal but no lifecycle result was ever written.
    NO_RESULT = "no_result"
    #: The child stays running forever.
    NEVER_SETTLES = "never_settles"
    #: The records carry no signature.
    UNSIGNED = "unsigned"


async def echo_executor(child: ChildAction) -> ChildOutcome:
    """Completes every child with its own input echoed: deterministic, comparable."""
    return "completed", {"echo": child.input, "capability": child.capability}, None


def bus_executor(client: AipClient, *, timeout_s: float = 30.0) -> ChildExecutor:
    """Execute a child that is itself a Hermes capability as a real Action on the bus.

    The child is published (signed by the client's gateway key) to its endpoint's actions
    subject with its own id and identity, and its one ActionResult is awaited: a real
    downstream capability call, executed and settled by whichever worker serves it.
    """

    async def execute(child: ChildAction) -> ChildOutcome:
        action = msgspec.convert(msgspec.to_builtins(child), Action)
        handle = await client.publish(action)
        result = await handle.result(timeout_s=timeout_s)
        error = None if result.error is None else msgspec.to_builtins(result.error)
        status = "failed" if result.status.value == "requires_human" else result.status.value
        return status, result.output, error

    return execute


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class FakeAipRuntime:
    nc: NATS
    #: Signs every record (the trusted gateway/runtime seed); None publishes them unsigned.
    seed: bytes | None
    prefix: str = "aip"
    execute: ChildExecutor = echo_executor
    fault: RuntimeFault = RuntimeFault.NONE
    #: The exact arguments of every `aip_call`, in order.
    calls: list[dict[str, Any]] = field(default_factory=list)
    subjects: Subjects = field(init=False)

    def __post_init__(self) -> None:
        self.subjects = Subjects(self.prefix)

    async def provision(self) -> None:
        """Create the queue and lifecycle streams (idempotent)."""
        js = self.nc.jetstream()
        for config in runtime_store_configs(self.subjects, StreamPolicy()):
            await provision_stream(js, config)

    @staticmethod
    def principal(
        endpoint_id: str,
        *,
        tenant_id: str | None = None,
        scopes: tuple[str, ...] = (ACTION_WRITE_SCOPE, "mcp:connect"),
        valid_for_ms: int = 3_600_000,
    ) -> AuthenticatedPrincipal:
        """The transport-authenticated identity of the Hermes serving `endpoint_id`."""
        return AuthenticatedPrincipal(
            principal_id=DELEGATE_PREFIX + endpoint_id,
            principal_kind=AGENT_KIND,
            tenant_id=tenant_id,
            authentication_issuer=ISSUER,
            credential_revision=1,
            scopes=list(scopes),
            expires_at_unix_ms=_now_ms() + valid_for_ms,
        )

    def tool_for(self, principal: AuthenticatedPrincipal) -> McpTool:
        """The `aip_call` tool of an MCP connection authenticated as `principal`."""

        async def aip_call(arguments: dict[str, Any]) -> str:
            return await self.aip_call(arguments, principal)

        return aip_call

    async def aip_call(self, arguments: dict[str, Any], principal: AuthenticatedPrincipal) -> str:
        """Create, execute and record one child Action, as the AIP MCP server would."""
        self.calls.append(json.loads(json.dumps(arguments)))
        fault = self.fault
        if fault is RuntimeFault.NOT_CREATED:
            return json.dumps({"accepted": True})
        child = self._child(arguments, principal)
        authenticated = self._authenticated(principal)
        owner = principal.principal_id
        if fault is RuntimeFault.FORGED_OWNER:
            owner = "agent:intruder"
        partition = principal.tenant_id
        if fault is RuntimeFault.TENANT_DRIFT:
            partition = "tenant-elsewhere"

        enqueued = _now_ms()

        async def queue(state: LifecycleState) -> None:
            record = QueueRecord(
                action=child,
                owner_principal_id=owner,
                authenticated=authenticated,
                actor_principal_id=principal.principal_id,
                tenant_partition=partition,
                state=state,
                enqueued_at_unix_ms=enqueued,
                updated_at_unix_ms=_now_ms(),
            )
            await self._publish(self.subjects.runtime_queue(child.id), record)

        await queue(LifecycleState.QUEUED)
        await queue(LifecycleState.RUNNING)
        if fault is RuntimeFault.NEVER_SETTLES:
            return json.dumps({"action_id": child.id, "state": "running"})
        status, output, error = await self.execute(child)
        state = LifecycleState(status)
        result = ChildResult(
            action_id=child.id,
            capability=child.capability,
            status=status,
            output=output,
            error=error,
            settled_at_unix_ms=_now_ms(),
        )
        if fault is not RuntimeFault.NO_RESULT:
            recorded = (
                LifecycleState.FAILED if fault is RuntimeFault.STORES_DISAGREE else state
            )
            lifecycle = LifecycleRecord(
                action_id=child.id,
                state=recorded,
                result=replace(result, status=recorded.value),
                updated_at_unix_ms=_now_ms(),
            )
            await self._publish(self.subjects.runtime_lifecycle(child.id), lifecycle)
        await queue(state)
        return json.dumps({"action_id": child.id, "status": status, "output": output})

    def _child(self, arguments: dict[str, Any], principal: AuthenticatedPrincipal) -> ChildAction:
        fields = dict(arguments)
        action_id = fields.pop("action_id")
        if self.fault is RuntimeFault.REPLACED_ACTION_ID:
            action_id = new_action_id()
        identity = Identity(
            principal_id=principal.principal_id,
            principal_kind=principal.principal_kind,
            tenant_id=principal.tenant_id,
            authentication_issuer=principal.authentication_issuer,
            credential_revision=principal.credential_revision,
        )
        if self.fault is RuntimeFault.IDENTITY_INTEGRITY:
            identity = replace(identity, principal_kind="user")
        if self.fault is RuntimeFault.ALTERED_INPUT:
            fields["input"] = {**fields.get("input", {}), "rewritten_by_model": True}
        if self.fault is RuntimeFault.MEMORY_ENRICHED:
            fields["memory"] = {**(fields.get("memory") or {}), "_aip": {"enriched": True}}
        document = {"id": action_id, "identity": msgspec.to_builtins(identity), **fields}
        return msgspec.convert(document, ChildAction)

    def _authenticated(self, principal: AuthenticatedPrincipal) -> AuthenticatedPrincipal:
        past = _now_ms() - 60_000
        if self.fault is RuntimeFault.EXPIRED_AUTH:
            return replace(principal, expires_at_unix_ms=past)
        if self.fault is RuntimeFault.NO_WRITE_SCOPE:
            kept = [scope for scope in principal.scopes if scope != ACTION_WRITE_SCOPE]
            return replace(principal, scopes=kept)
        if self.fault is RuntimeFault.TENANT_EXPIRED:
            return replace(principal, tenant_expires_at_unix_ms=past)
        return principal

    async def _publish(self, subject: str, record: QueueRecord | LifecycleRecord) -> None:
        payload = msgspec.json.encode(record)
        signed = self.seed is not None and self.fault is not RuntimeFault.UNSIGNED
        headers = sign_envelope(payload, self.seed) if signed and self.seed else {}
        await self.nc.jetstream().publish(subject, payload, headers=headers or None)
