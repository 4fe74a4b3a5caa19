"""The operator's operation contract (spec "Operation contract") and the risk levels of the
internal operation specs.

What travels on `aip.hermes.{endpoint}.manifest` is the AIP manifest
(`worker/wire/manifests.py`, `schemas.aip.manifest`); the operator's contract here supplies
its `output_schema` there, the catalog (`worker/operations/catalog.py`) every capability's
CapabilityContract.
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
