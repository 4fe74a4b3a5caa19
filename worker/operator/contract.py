"""The operator's published operation contract (spec "Operation contract").

Everything a caller needs to decide whether and how to invoke the operator, as the manifest
carries it: kind and stability, side effects, data handling, execution and expected
completion, latency, transaction and compensation, idempotency, the approval policy, the
queue-delay and availability hints, the output schema and the operator's own principal.
The deployment-dependent values (idempotency TTL) come from settings, so the manifest says
what this deployment does; the hints are the spec's declarations, not measurements.
"""

from __future__ import annotations

from schemas.action import Mode
from schemas.ids import json_schema
from schemas.manifest import (
    ApprovalPolicy,
    CapabilityKind,
    Compensation,
    DataClassification,
    DataHandling,
    ExpectedCompletion,
    IdempotencyContract,
    OperationContract,
    SideEffect,
    Stability,
    Transaction,
)
from schemas.operator import OperatorOutput
from worker.trust.approval_ledger import DEFAULT_APPROVAL_TTL_MS

#: The AIP principal each endpoint's operator owns (spec "Route first-class delegation").
OPERATOR_PRINCIPAL = "agent:hermes_operator:{endpoint}"
#: The spec's declarations.
EXPECTED_LATENCY_MS = 30_000
MAX_QUEUE_DELAY_MS = 10_000
AVAILABILITY_TARGET = "99.9%"
#: Evidence every approval decision records (`schemas.approval.ApprovalRecord`).
APPROVAL_EVIDENCE = ["reason", "input_snapshot", "policy_decision"]


def operator_contract(*, idempotency_ttl_ms: int) -> OperationContract:
    """The contract, with the deployment's idempotency TTL (`AIPD_IDEMPOTENCY_TTL_MS`, by
    default `AIPD_RESULT_TTL_MS`)."""
    return OperationContract(
        kind=CapabilityKind.AGENT,
        stability=Stability.STABLE,
        provider_request="POST /v1/runs with endpoint Bearer authentication",
        side_effects=[
            SideEffect.READ,
            SideEffect.WRITE,
            SideEffect.SEND_MESSAGE,
            SideEffect.EXTERNAL_NETWORK,
            SideEffect.CODE_EXECUTION,
        ],
        data=DataHandling(
            classification=DataClassification.CONFIDENTIAL,
            contains_pii=True,
            redaction_required=True,
        ),
        expected_completion=ExpectedCompletion(mode=Mode.STREAM, async_expected=True),
        expected_latency_ms=EXPECTED_LATENCY_MS,
        transaction=Transaction(supported=False),
        compensation=Compensation(rollback_supported=False, approval_required=True),
        idempotency=IdempotencyContract(
            required=True,
            key="action_id",
            scope="capability",
            ttl_ms=idempotency_ttl_ms,
            on_duplicate="return_original_result",
        ),
        approval=ApprovalPolicy(
            required=True,
            authority="tenant_policy",
            ttl_ms=DEFAULT_APPROVAL_TTL_MS,
            evidence=list(APPROVAL_EVIDENCE),
        ),
        max_queue_delay_ms=MAX_QUEUE_DELAY_MS,
        availability_target=AVAILABILITY_TARGET,
        output_schema=json_schema(OperatorOutput),
        principal=OPERATOR_PRINCIPAL,
    )
