"""The capability manifest a worker answers on `aip.hermes.{endpoint}.manifest` and `$SRV`.

Every entry declares its route, risk, approval, idempotency, timeout, input schema and the
execution modes it offers (an Action asking for another mode is refused before anything is
sent). A capability whose spec publishes a whole operation contract (the operator, spec
"Operation contract") carries it in `contract`: kind and stability, side effects, data
handling, expected completion and latency, transaction and compensation, idempotency and
approval policy, queue-delay and availability hints, the output schema and its principal.
The hints are declarations, not observed performance.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from schemas._base import WireStruct
from schemas.action import Mode


class Risk(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class CapabilityKind(StrEnum):
    AGENT = "agent"
    TOOL = "tool"


class Stability(StrEnum):
    STABLE = "stable"
    EXPERIMENTAL = "experimental"


class SideEffect(StrEnum):
    READ = "read"
    WRITE = "write"
    SEND_MESSAGE = "send_message"
    EXTERNAL_NETWORK = "external_network"
    CODE_EXECUTION = "code_execution"


class DataClassification(StrEnum):
    PUBLIC = "public"
    INTERNAL = "internal"
    CONFIDENTIAL = "confidential"
    RESTRICTED = "restricted"


class DataHandling(WireStruct, kw_only=True, frozen=True):
    classification: DataClassification
    contains_pii: bool
    redaction_required: bool


class ExpectedCompletion(WireStruct, kw_only=True, frozen=True):
    #: How the work usually completes: `stream` means progress arrives as chunks.
    mode: Mode
    #: The result usually arrives after the publish returns.
    async_expected: bool


class Transaction(WireStruct, kw_only=True, frozen=True):
    #: False: the capability joins no transaction (spec "Transaction: None").
    supported: bool


class Compensation(WireStruct, kw_only=True, frozen=True):
    rollback_supported: bool
    #: Compensating work needs its own approval.
    approval_required: bool


class IdempotencyContract(WireStruct, kw_only=True, frozen=True):
    required: bool
    #: What a duplicate is recognised by: the Action id (its capability and input are
    #: fingerprinted; the same id with another request is a collision).
    key: str
    #: The extent a key is unique in.
    scope: str
    #: How long a settled result is kept and replayed for a duplicate.
    ttl_ms: int
    #: `return_original_result`: a duplicate gets the stored result, nothing runs again.
    on_duplicate: str


class ApprovalPolicy(WireStruct, kw_only=True, frozen=True):
    required: bool
    #: Who decides: `tenant_policy`, an approver whose membership covers the tenant.
    authority: str
    #: How long a decision stays usable by default (`approve --ttl-minutes`).
    ttl_ms: int
    #: Evidence every decision records: `reason`, `input_snapshot`, `policy_decision`.
    evidence: list[str]


class OperationContract(WireStruct, kw_only=True, frozen=True):
    kind: CapabilityKind
    stability: Stability
    #: The provider request and its authentication, e.g. `POST /v1/runs` with endpoint
    #: Bearer authentication.
    provider_request: str
    side_effects: list[SideEffect]
    data: DataHandling
    expected_completion: ExpectedCompletion
    expected_latency_ms: int
    transaction: Transaction
    compensation: Compensation
    idempotency: IdempotencyContract
    approval: ApprovalPolicy
    #: Declared upper bound of the delay before a queued Action starts (a hint).
    max_queue_delay_ms: int
    #: Declared availability target, e.g. `99.9%` (a target, not an observation).
    availability_target: str
    #: JSON Schema of `ActionResult.output` (`schemas/json/OperatorOutput.json`).
    output_schema: dict[str, Any]
    #: The AIP principal this capability owns, e.g. `agent:hermes_operator:{endpoint}`.
    principal: str | None = None


class CapabilityEntry(WireStruct, kw_only=True, frozen=True):
    capability: str
    operation: str
    method: str
    #: The Hermes route template, e.g. `/v1/runs/{run_id}`.
    route: str
    read_only: bool
    risk: Risk
    approval_required: bool
    idempotency_required: bool
    streaming: bool
    timeout_ms: int
    input_schema: dict[str, Any]
    #: The `Action.mode`s this capability offers; any other is refused
    #: (`configuration_or_input`) before anything is sent.
    execution_modes: list[Mode]
    #: A cancel request (`aip.hermes.{endpoint}.cancel`) is honoured while it runs.
    cancellable: bool
    contract: OperationContract | None = None


class CapabilityManifest(WireStruct, kw_only=True, frozen=True):
    endpoint_id: str
    worker_version: str
    capabilities: list[CapabilityEntry]
    #: The tenant the endpoint is bound to: it admits only Actions whose verified tenant is
    #: this one. None: it serves every tenant.
    tenant_id: str | None = None
    #: When the binding expires (Unix ms); from then on the endpoint admits nothing.
    tenant_expires_at_unix_ms: int | None = None
    #: Bound to no tenant and shared between tenants: only then does an unbound endpoint
    #: admit an Action carrying a tenant, and it partitions its ids per tenant.
    shared: bool = False
