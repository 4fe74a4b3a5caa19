"""Manifest, Capability and CapabilityContract (shared/reference/aip-1.0-wire.md §1.14;
upstream `manifest.schema.json`, `capability_contract.schema.json`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from schemas.aip._base import AipStruct, UInt
from schemas.aip.action import TransactionMode
from schemas.aip.approval import ApprovalPolicy
from schemas.aip.common import Principal, Risk

SideEffect = Literal[
    "read",
    "write",
    "delete",
    "send_message",
    "financial",
    "identity",
    "medical",
    "legal",
    "external_network",
    "code_execution",
]
CapabilityKind = Literal["agent", "tool", "workflow", "channel", "resource", "human_task"]
Stability = Literal["stable", "experimental", "deprecated"]


class Idempotency(AipStruct, frozen=True):
    """How repeats of an Action are recognised and answered."""

    requirement: Annotated[
        Literal["required", "optional", "unsupported"],
        Meta(description="Whether an idempotency key is required."),
    ]
    collision_behavior: Annotated[
        Literal["return_original_result", "reject_conflict", "revalidate_input_hash"],
        Meta(description="What a repeated key gets."),
    ]
    key_scope: Annotated[
        Literal["action", "capability", "principal", "tenant", "external_account"],
        Meta(description="Where a key is unique."),
    ]
    ttl_ms: Annotated[UInt | None, Meta(description="How long a key is remembered.")] = None


class Execution(AipStruct, frozen=True):
    """How the capability runs."""

    supports_sync: Annotated[bool, Meta(description="Answers `sync` Actions.")]
    supports_async: Annotated[bool, Meta(description="Answers `async` Actions.")]
    supports_streaming: Annotated[bool, Meta(description="Streams chunks.")]
    supports_cancel: Annotated[bool, Meta(description="Can be cancelled.")]
    supports_retry: Annotated[bool, Meta(description="May be retried.")]
    expected_completion: Annotated[
        Literal["sync", "async", "streaming", "any"], Meta(description="Usual completion.")
    ]
    retry_safety: Annotated[
        Literal["safe", "safe_with_idempotency_key", "unsafe", "unknown"],
        Meta(description="Whether a retry is safe."),
    ]


class Residency(AipStruct, frozen=True):
    """Where data may live."""

    allowed_regions: Annotated[list[str], Meta(description="Allowed regions.")] = msgspec.field(
        default_factory=list
    )
    prohibited_regions: Annotated[list[str], Meta(description="Prohibited regions.")] = (
        msgspec.field(default_factory=list)
    )


class Retention(AipStruct, frozen=True):
    """How long data is kept."""

    legal_hold_allowed: Annotated[bool, Meta(description="Whether a legal hold applies.")]
    retain_for_ms: Annotated[UInt | None, Meta(description="Kept for, in ms.")] = None
    delete_after_ms: Annotated[UInt | None, Meta(description="Deleted after, in ms.")] = None


class DataPolicy(AipStruct, frozen=True):
    """What data the capability touches."""

    sensitivity: Annotated[
        Literal["public", "internal", "confidential", "restricted", "regulated", "unknown"],
        Meta(description="Data sensitivity."),
    ]
    contains_pii: Annotated[bool, Meta(description="Whether it may carry PII.")]
    redaction_required: Annotated[bool, Meta(description="Whether output is redacted.")]
    residency: Annotated[Residency | None, Meta(description="Residency rules.")] = None
    retention: Annotated[Retention | None, Meta(description="Retention rules.")] = None


class Credentials(AipStruct, frozen=True):
    """What credential the capability needs."""

    required: Annotated[bool, Meta(description="Whether a credential is required.")]
    allow_oauth_refresh: Annotated[bool, Meta(description="Whether OAuth refresh is allowed.")]
    accepted_issuers: Annotated[list[str], Meta(description="Accepted issuers.")] = msgspec.field(
        default_factory=list
    )
    required_scopes: Annotated[list[str], Meta(description="Scopes needed.")] = msgspec.field(
        default_factory=list
    )


class Sla(AipStruct, frozen=True):
    """Service levels."""

    async_expected: Annotated[bool, Meta(description="Whether answers are usually async.")]
    expected_latency_ms: Annotated[UInt | None, Meta(description="Usual latency.")] = None
    timeout_ms: Annotated[UInt | None, Meta(description="Time budget.")] = None
    max_queue_delay_ms: Annotated[UInt | None, Meta(description="Longest queue wait.")] = None
    availability_target: Annotated[
        str | None, Meta(description="Availability target, e.g. `99.9%`.")
    ] = None


class TransactionSupport(AipStruct, frozen=True):
    """Transactional modes supported."""

    requires_plan_before_commit: Annotated[bool, Meta(description="Commit needs a plan.")]
    dry_run_fidelity: Annotated[
        Literal["schema_only", "policy_and_schema", "downstream_validation", "full_simulation"],
        Meta(description="How faithful a dry run is."),
    ]
    supported_modes: Annotated[list[TransactionMode], Meta(description="Supported modes.")] = (
        msgspec.field(default_factory=list)
    )


class Compensation(AipStruct, frozen=True):
    """How effects are undone."""

    mode: Annotated[
        Literal["not_required", "supported", "best_effort", "rollback_not_supported"],
        Meta(description="Compensation mode."),
    ]
    requires_approval: Annotated[bool, Meta(description="Whether compensation needs approval.")]
    compensation_capability_id: Annotated[
        str | None, Meta(description="The capability that compensates.")
    ] = None
    compensation_window_ms: Annotated[
        UInt | None, Meta(description="How long compensation is possible.")
    ] = None


class CapabilityContract(AipStruct, frozen=True):
    """What a capability promises: effects, idempotency, execution, data, approval, SLA."""

    idempotency: Annotated[Idempotency, Meta(description="Idempotency rules.")]
    execution: Annotated[Execution, Meta(description="Execution modes.")]
    data: Annotated[DataPolicy, Meta(description="Data handling.")]
    side_effects: Annotated[
        list[SideEffect], Meta(description="Its side effects (a connector declares at least one).")
    ] = msgspec.field(default_factory=list)
    credentials: Annotated[Credentials | None, Meta(description="Credential needs.")] = None
    approval: Annotated[ApprovalPolicy | None, Meta(description="Approval policy.")] = None
    sla: Annotated[Sla | None, Meta(description="Service levels.")] = None
    transaction: Annotated[
        TransactionSupport | None, Meta(description="Transaction support (absent: none).")
    ] = None
    compensation: Annotated[Compensation | None, Meta(description="Compensation.")] = None


Binding = Annotated[
    dict[str, Any],
    Meta(description="A binding: `profile` plus the binding's own keys (route, method, …)."),
]


class Capability(AipStruct, frozen=True):
    """One operation the agent offers."""

    id: Annotated[str, Meta(description="Capability id, e.g. `cap:hermes_agent:h1:chat`.")]
    name: Annotated[str, Meta(description="Operation name.")]
    kind: Annotated[CapabilityKind, Meta(description="Capability kind.")]
    input_schema: Annotated[dict[str, Any], Meta(description="JSON Schema of the input.")]
    output_schema: Annotated[
        dict[str, Any] | None, Meta(description="JSON Schema of the output.")
    ] = None
    description: Annotated[str | None, Meta(description="What it does.")] = None
    risk: Annotated[Risk | None, Meta(description="Risk.")] = None
    stability: Annotated[Stability | None, Meta(description="Stability.")] = None
    cost: Annotated[Any, Meta(description="Free cost facts.")] = None
    auth: Annotated[Any, Meta(description="Free auth facts, e.g. the scheme.")] = None
    bindings: Annotated[list[Binding], Meta(description="Its bindings.")] = msgspec.field(
        default_factory=list
    )
    requires_human_approval: Annotated[
        bool | None, Meta(description="Whether a human must approve.")
    ] = None
    contract: Annotated[CapabilityContract | None, Meta(description="Its contract.")] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for binding in self.bindings:
            if not isinstance(binding.get("profile"), str):
                raise ValueError("every binding names its `profile`")


class ManifestFilter(AipStruct, frozen=True):
    """Which capabilities a manifest request wants."""

    capability_ids: Annotated[list[str], Meta(description="Ids.")] = msgspec.field(
        default_factory=list
    )
    resource_kinds: Annotated[list[str], Meta(description="Resource kinds.")] = msgspec.field(
        default_factory=list
    )
    profiles: Annotated[list[str], Meta(description="Profiles.")] = msgspec.field(
        default_factory=list
    )
    risk: Annotated[list[Risk], Meta(description="Risks.")] = msgspec.field(default_factory=list)
    side_effects: Annotated[list[SideEffect], Meta(description="Effects.")] = msgspec.field(
        default_factory=list
    )
    requires_approval: Annotated[bool | None, Meta(description="Approval needed.")] = None
    supports_streaming: Annotated[bool | None, Meta(description="Streams.")] = None
    supports_transactions: Annotated[bool | None, Meta(description="Transactional.")] = None


class ManifestRequest(AipStruct, frozen=True):
    """A request for the agent's manifest."""

    profiles: Annotated[list[str], Meta(description="Profiles wanted.")] = msgspec.field(
        default_factory=list
    )
    filter: Annotated[ManifestFilter | None, Meta(description="Which capabilities.")] = None


class Manifest(AipStruct, frozen=True):
    """What an agent offers (`aip.discovery.v1.manifest_response`, body key `manifest`)."""

    manifest_version: Annotated[str, Meta(description="E.g. `aip-manifest/v1`.")]
    agent: Annotated[Principal, Meta(description="The provider's identity.")]
    profiles: Annotated[list[str], Meta(min_length=1, description="Supported profiles.")]
    capabilities: Annotated[list[Capability], Meta(description="Capabilities (unique ids).")] = (
        msgspec.field(default_factory=list)
    )
    resources: Annotated[list[dict[str, Any]], Meta(description="Resources (none here).")] = (
        msgspec.field(default_factory=list)
    )
    channels: Annotated[list[Any], Meta(description="Channel declarations.")] = msgspec.field(
        default_factory=list
    )
    security: Annotated[Any, Meta(description="Free security facts.")] = None
    governance: Annotated[Any, Meta(description="Free governance facts.")] = None
    limits: Annotated[Any, Meta(description="Free limits.")] = None
    compatibility: Annotated[
        Any, Meta(description="Free; per profile, e.g. `native_nats.subject`.")
    ] = None
    extensions: Annotated[Any, Meta(description="Free extensions.")] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        ids = [capability.id for capability in self.capabilities]
        if len(ids) != len(set(ids)):
            raise ValueError("capability ids must be unique")
