"""The AIP 1.0 Action and what it carries (shared/reference/aip-1.0-wire.md §1.2;
upstream `action.schema.json`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from schemas.aip._base import AipStruct, NonEmptyStr, PositiveInt
from schemas.aip.approval import ApprovalDecision
from schemas.aip.common import Conversation, IdentityContext, Principal, Timestamp


class Mode(StrEnum):
    """How the caller wants the answer: `streaming`, not `stream`."""

    SYNC = "sync"
    ASYNC = "async"
    STREAMING = "streaming"


class DelegationEntry(AipStruct, frozen=True):
    """One hop of an Action's delegation chain."""

    from_: Annotated[Principal, Meta(description="Who delegated.")] = msgspec.field(name="from")
    to: Annotated[Principal, Meta(description="To whom.")]
    scope: Annotated[str, Meta(description="The delegated scope.")]
    delegated_at: Annotated[Timestamp, Meta(description="When (RFC 3339).")]


class FederationContext(AipStruct, frozen=True):
    """Cross-domain routing facts."""

    trust_domain: Annotated[str, Meta(description="The originating trust domain.")]
    hops: Annotated[list[str], Meta(description="Domains already traversed.")] = msgspec.field(
        default_factory=list
    )


class Callback(AipStruct, frozen=True):
    """Where asynchronous or streamed answers go."""

    profile: Annotated[
        str, Meta(description="Binding profile, e.g. `aip.native.nats.v1`, `aip.native.http.v1`.")
    ]
    target: Annotated[str, Meta(description="A URI or a subject.")]
    metadata: Annotated[Any, Meta(description="Free delivery configuration.")] = None


class ObservabilityContext(AipStruct, frozen=True):
    """Trace facts."""

    trace_id: Annotated[str | None, Meta(description="Trace id.")] = None
    span_id: Annotated[str | None, Meta(description="Span id.")] = None
    fields: Annotated[Any, Meta(description="Free trace fields.")] = None


class ComplianceContext(AipStruct, frozen=True):
    """Compliance regimes and data classification."""

    regimes: Annotated[list[str], Meta(description="Regimes that apply.")] = msgspec.field(
        default_factory=list
    )
    data_classification: Annotated[str | None, Meta(description="Data class.")] = None
    metadata: Annotated[Any, Meta(description="Free metadata.")] = None


TransactionMode = Literal[
    "execute", "dry_run", "plan", "commit", "compensate", "reconcile", "rollback_not_supported"
]


class ActionTransaction(AipStruct, frozen=True):
    """The Action's transactional mode."""

    mode: Annotated[TransactionMode, Meta(description="Transactional mode.")]
    transaction_id: Annotated[str | None, Meta(description="Transaction id (`txn_…`).")] = None
    plan_id: Annotated[str | None, Meta(description="Plan committed (mode `commit`).")] = None
    compensation_for: Annotated[
        str | None, Meta(description="Action compensated (mode `compensate`).")
    ] = None


class Action(AipStruct, frozen=True):
    """A request to run one capability."""

    id: Annotated[str, Meta(description="Stable Action id (`act_` + 32 hex).")]
    capability_id: Annotated[
        str, Meta(description="Target capability, e.g. `cap:hermes_agent:h1:chat`.")
    ]
    input: Annotated[Any, Meta(description="Input satisfying the capability's input schema.")]
    mode: Annotated[Mode | None, Meta(description="Answer mode; absent: the default.")] = None
    idempotency_key: Annotated[
        NonEmptyStr | None, Meta(description="Idempotency key (scope per the contract).")
    ] = None
    timeout_ms: Annotated[PositiveInt | None, Meta(description="Time budget in ms.")] = None
    conversation: Annotated[Conversation | None, Meta(description="The channel thread.")] = None
    memory_context: Annotated[Any, Meta(description="Free shared context.")] = None
    delegation_chain: Annotated[
        list[DelegationEntry], Meta(max_length=10, description="Delegation hops.")
    ] = msgspec.field(default_factory=list)
    federation: Annotated[FederationContext | None, Meta(description="Cross-domain routing.")] = (
        None
    )
    callback: Annotated[Callback | None, Meta(description="Where answers go.")] = None
    observability: Annotated[ObservabilityContext | None, Meta(description="Trace facts.")] = None
    compliance: Annotated[ComplianceContext | None, Meta(description="Compliance.")] = None
    identity: Annotated[IdentityContext | None, Meta(description="Whose Action it is.")] = None
    approval: Annotated[
        ApprovalDecision | None,
        Meta(description="An `approved` decision; verified against the durable record."),
    ] = None
    transaction: Annotated[ActionTransaction | None, Meta(description="Transactional mode.")] = None
