"""The AIP runtime's Action queue and lifecycle records, as the delegation resolver reads them.

First-class delegation returns only the *native* child result (spec "Verify the delegated
result"): Hermes calls `aip_call` through the AIP MCP server, the AIP runtime enqueues the
child Action and records its lifecycle, and this connector reads both stores afterwards. On
this bus the two stores are JetStream streams the runtime writes (a departure,
docs/architecture.md §8; see
docs/delegation.md): the last message on `{prefix}.runtime.queue.{action_id}` is the queue
record, the last on `{prefix}.runtime.lifecycle.{action_id}` the lifecycle record. Each is
signed like an envelope (`Aip-Signer`/`Aip-Signature`) by a trusted gateway/runtime key.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec

from schemas._base import WireStruct
from schemas.delegation import MAX_SCOPES, AnyCapabilityId, ChildAction, Scope
from schemas.ids import ActionId, ShortText, UnixMs


class LifecycleState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({LifecycleState.COMPLETED, LifecycleState.FAILED, LifecycleState.CANCELLED})


class AuthenticatedPrincipal(WireStruct, kw_only=True, frozen=True):
    """Who the MCP transport authenticated when the child was created (never from a payload)."""

    principal_id: ShortText
    principal_kind: ShortText
    tenant_id: ShortText | None = None
    authentication_issuer: ShortText | None = None
    credential_revision: Annotated[int, msgspec.Meta(ge=0)] | None = None
    scopes: Annotated[list[Scope], msgspec.Meta(max_length=MAX_SCOPES)] = msgspec.field(
        default_factory=list
    )
    #: When the authentication expires; a child enqueued at or after it is not authenticated.
    expires_at_unix_ms: UnixMs
    #: When the principal's membership of `tenant_id` expires (None: it does not).
    tenant_expires_at_unix_ms: UnixMs | None = None


class QueueRecord(WireStruct, kw_only=True, frozen=True):
    """The runtime's Action queue entry of one child Action."""

    action: ChildAction
    #: The principal that owns the queue entry.
    owner_principal_id: ShortText
    authenticated: AuthenticatedPrincipal
    #: The actor context the child executes under.
    actor_principal_id: ShortText
    #: The tenant partition the entry is stored in.
    tenant_partition: ShortText | None = None
    state: LifecycleState
    #: When the runtime accepted the child: the authentication must be valid then.
    enqueued_at_unix_ms: UnixMs
    updated_at_unix_ms: UnixMs


class ChildResult(WireStruct, kw_only=True, frozen=True):
    """The child's own terminal result, as the runtime settled it."""

    action_id: ActionId
    capability: AnyCapabilityId
    status: Annotated[str, msgspec.Meta(pattern=r"^(completed|failed|cancelled)\Z")]
    output: Any = None
    #: The child's error as its executor reported it (foreign codes are kept verbatim).
    error: dict[str, Any] | None = None
    settled_at_unix_ms: UnixMs


class LifecycleRecord(WireStruct, kw_only=True, frozen=True):
    """The runtime's lifecycle entry of one child Action: its state and durable result."""

    action_id: ActionId
    state: LifecycleState
    result: ChildResult | None = None
    updated_at_unix_ms: UnixMs
