"""The reference Hermes connector's 35 operations and the CapabilityContract of each, with
the few places where this project is deliberately stricter (shared/reference/aip-1.0-wire.md
§4.2, §4.3, §4.10; docs/capabilities.md has the table and the reasons).

One row per operation holds what differs between operations; `contract` derives the rest
by the reference connector's rules (idempotency scope and TTL, retry safety, PII and
redaction, SLA, approval policy, compensation), so the two cannot drift apart row by row.
The registry's specs are read from these rows (worker/operations/specs.py) and the manifest
publishes each row's contract (worker/wire/manifests.py); tests/unit/test_capability_catalog.py
checks the rows against the reference rules.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Literal

from schemas.action import Mode
from schemas.aip.approval import ApprovalPolicy, TenantPolicySelector
from schemas.aip.manifest import (
    CapabilityContract,
    CapabilityKind,
    Compensation,
    DataPolicy,
    Execution,
    Idempotency,
    SideEffect,
    Sla,
)

Sensitivity = Literal["internal", "confidential", "restricted"]
Completion = Literal["sync", "streaming"]

#: The reference connector's id and profile (§4.1).
CONNECTOR_ID: Final = "hermes-agent"
CONNECTOR_PROFILE: Final = "aip.connector.hermes_agent.v1"
#: How long an idempotency key is remembered when one is required (§4.2).
IDEMPOTENCY_TTL_MS: Final = 86_400_000
#: How long an approval stays valid (§4.2, approval policy).
APPROVAL_TTL_MS: Final = 900_000
#: The six operations that only describe the Hermes server: no redaction needed.
DISCOVERY: Final = frozenset(
    {"health", "health_detailed", "models", "capabilities", "skills", "toolsets"}
)


@dataclass(frozen=True, slots=True)
class OperationRow:
    """What one operation's contract does not share with the others."""

    name: str
    method: str
    path: str
    kind: CapabilityKind
    risk: Literal["low", "medium", "high", "critical"]
    stable: bool
    approval: bool
    idempotency_required: bool
    supports_async: bool
    #: Streams its provider events as chunks (and so can be cancelled mid-stream).
    streaming: bool
    retry: bool
    completion: Completion
    side_effects: tuple[SideEffect, ...]
    sensitivity: Sensitivity
    sla_timeout_ms: int
    #: Why this project departs from the reference row ('' where it does not).
    stricter: str = ""

    @property
    def read_only(self) -> bool:
        """The reference connector's read-only set: its `low`-risk rows."""
        return self.risk == "low"


R: Final[tuple[SideEffect, ...]] = ("read", "external_network")
RW: Final[tuple[SideEffect, ...]] = ("read", "write", "external_network")
RWS: Final[tuple[SideEffect, ...]] = ("read", "write", "send_message", "external_network")
RD: Final[tuple[SideEffect, ...]] = ("read", "delete", "external_network")
OPERATOR_EFFECTS: Final[tuple[SideEffect, ...]] = (
    "read", "write", "send_message", "external_network", "code_execution",
)  # fmt: skip


def _read(
    name: str, method: str, path: str, *, stable: bool = True, kind: CapabilityKind = "tool"
) -> OperationRow:
    return OperationRow(
        name, method, path, kind, "low", stable, approval=False, idempotency_required=False,
        supports_async=False, streaming=False, retry=True, completion="sync",
        side_effects=R, sensitivity="internal", sla_timeout_ms=60_000,
    )  # fmt: skip


#: Turns (chat, responses, session chat) and writes need an idempotency key here: a turn
#: writes to a session and may call tools, so a retry without a key would run it twice.
_KEYED = (
    "requires an idempotency key, where the reference connector makes it optional: a turn "
    "writes to its session and may call tools, so a retry without a key would run it twice"
)
_RUN_START = (
    "high risk and approval required, where the reference connector has medium and none: "
    "a run executes tools towards an objective nobody reviewed"
)
_RUN_CONTROL = (
    "high risk, where the reference connector has medium: it answers or ends a run that "
    "may be executing tools"
)
_JOB_WRITE = (
    "high risk, where the reference connector has medium: a job runs an agent on a schedule "
    "with nobody present"
)

# Columns: name, method, path, kind, risk, stable, approval, idempotency_required,
# supports_async, streaming, retry, completion, side_effects, sensitivity, sla_timeout_ms,
# stricter (the reason for a departure from the reference row).
# fmt: off
ROWS: Final[tuple[OperationRow, ...]] = (
    _read("health", "GET", "/health"),
    _read("health_detailed", "GET", "/health/detailed"),
    _read("models", "GET", "/v1/models"),
    _read("capabilities", "GET", "/v1/capabilities"),
    _read("skills", "GET", "/v1/skills", stable=False),
    _read("toolsets", "GET", "/v1/toolsets", stable=False),
    OperationRow("chat", "POST", "/v1/chat/completions", "agent", "medium", True, False, True, False, False, False, "sync", RWS, "confidential", 60_000, _KEYED),  # noqa: E501
    OperationRow("chat_stream", "POST", "/v1/chat/completions", "agent", "medium", True, False, True, True, True, False, "streaming", RWS, "confidential", 300_000, _KEYED),  # noqa: E501
    OperationRow("responses", "POST", "/v1/responses", "agent", "medium", True, False, True, False, False, False, "sync", RWS, "confidential", 60_000, _KEYED),  # noqa: E501
    OperationRow("responses_stream", "POST", "/v1/responses", "agent", "medium", True, False, True, True, True, False, "streaming", RWS, "confidential", 300_000, _KEYED),  # noqa: E501
    _read("response_get", "GET", "/v1/responses/{response_id}", stable=False, kind="agent"),
    OperationRow("response_delete", "DELETE", "/v1/responses/{response_id}", "agent", "high", False, True, True, False, False, False, "sync", RD, "restricted", 60_000),  # noqa: E501
    OperationRow("run_start", "POST", "/v1/runs", "workflow", "high", True, True, True, True, False, False, "sync", RW, "confidential", 60_000, _RUN_START),  # noqa: E501
    _read("run_status", "GET", "/v1/runs/{run_id}", kind="workflow"),
    OperationRow("run_events", "GET", "/v1/runs/{run_id}/events", "workflow", "low", True, False, False, True, True, True, "streaming", R, "confidential", 300_000),  # noqa: E501
    OperationRow("run_approval", "POST", "/v1/runs/{run_id}/approval", "workflow", "high", True, True, True, False, False, False, "sync", RW, "restricted", 60_000, _RUN_CONTROL),  # noqa: E501
    OperationRow("run_stop", "POST", "/v1/runs/{run_id}/stop", "workflow", "high", True, True, True, False, False, False, "sync", RW, "restricted", 60_000, _RUN_CONTROL),  # noqa: E501
    OperationRow("operator", "POST", "/v1/runs", "agent", "high", True, True, True, True, True, False, "streaming", OPERATOR_EFFECTS, "confidential", 900_000),  # noqa: E501
    _read("sessions_list", "GET", "/api/sessions"),
    OperationRow("session_create", "POST", "/api/sessions", "tool", "medium", True, False, True, False, False, False, "sync", RW, "confidential", 60_000),  # noqa: E501
    _read("session_get", "GET", "/api/sessions/{session_id}"),
    OperationRow("session_patch", "PATCH", "/api/sessions/{session_id}", "tool", "medium", True, False, True, False, False, False, "sync", RW, "confidential", 60_000),  # noqa: E501
    OperationRow("session_delete", "DELETE", "/api/sessions/{session_id}", "tool", "high", True, True, True, False, False, False, "sync", RD, "restricted", 60_000),  # noqa: E501
    _read("session_messages", "GET", "/api/sessions/{session_id}/messages"),
    OperationRow("session_fork", "POST", "/api/sessions/{session_id}/fork", "tool", "medium", True, False, True, False, False, False, "sync", RW, "confidential", 60_000),  # noqa: E501
    OperationRow("session_chat", "POST", "/api/sessions/{session_id}/chat", "agent", "medium", True, False, True, False, False, False, "sync", RWS, "confidential", 60_000, _KEYED),  # noqa: E501
    OperationRow("session_chat_stream", "POST", "/api/sessions/{session_id}/chat/stream", "agent", "medium", True, False, True, False, True, False, "streaming", RWS, "confidential", 300_000, _KEYED),  # noqa: E501
    _read("jobs_list", "GET", "/api/jobs"),
    OperationRow("job_create", "POST", "/api/jobs", "tool", "high", True, True, True, False, False, False, "sync", RW, "confidential", 60_000, _JOB_WRITE),  # noqa: E501
    _read("job_get", "GET", "/api/jobs/{job_id}"),
    OperationRow("job_update", "PATCH", "/api/jobs/{job_id}", "tool", "high", True, True, True, False, False, False, "sync", RW, "confidential", 60_000, _JOB_WRITE),  # noqa: E501
    OperationRow("job_delete", "DELETE", "/api/jobs/{job_id}", "tool", "high", True, True, True, False, False, False, "sync", RD, "restricted", 60_000),  # noqa: E501
    OperationRow("job_pause", "POST", "/api/jobs/{job_id}/pause", "tool", "medium", True, True, True, False, False, False, "sync", RW, "internal", 60_000),  # noqa: E501
    OperationRow("job_resume", "POST", "/api/jobs/{job_id}/resume", "tool", "high", True, True, True, False, False, False, "sync", RW, "internal", 60_000, _JOB_WRITE),  # noqa: E501
    OperationRow("job_run", "POST", "/api/jobs/{job_id}/run", "agent", "high", True, True, True, False, False, False, "sync", RW, "confidential", 60_000),  # noqa: E501
)
# fmt: on

BY_NAME: Final = {row.name: row for row in ROWS}
#: The streaming capabilities (expected completion `streaming`): the only ones with a chunk
#: stream; every other capability's signed result is its whole answer, as upstream's.
STREAMING: Final = frozenset(row.name for row in ROWS if row.completion == "streaming")
#: The streaming twins: each answers `stream` Actions only, its sync sibling never streams.
STREAM_ONLY: Final = frozenset({"chat_stream", "responses_stream", "session_chat_stream"})


def default_mode(name: str) -> Mode:
    """The mode a caller that names none asks `name` for: `stream` for a streaming twin (the
    only one it takes), `async` otherwise."""
    return Mode.STREAM if name in STREAM_ONLY else Mode.ASYNC


def reference_row(row: OperationRow) -> OperationRow:
    """The reference connector's own row, undoing this project's documented departures."""
    if row.stricter == _KEYED:
        return replace(row, idempotency_required=False, stricter="")
    if row.stricter == _RUN_START:
        return replace(row, risk="medium", approval=False, stricter="")
    if row.stricter in (_RUN_CONTROL, _JOB_WRITE):
        return replace(row, risk="medium", stricter="")
    return row


def contract(row: OperationRow) -> CapabilityContract:
    """The CapabilityContract of `row`, by the reference connector's rules (§4.2)."""
    streaming_op = row.completion == "streaming"
    return CapabilityContract(
        side_effects=list(row.side_effects),
        idempotency=Idempotency(
            requirement="required" if row.idempotency_required else "optional",
            collision_behavior="return_original_result",
            key_scope="capability",
            ttl_ms=IDEMPOTENCY_TTL_MS if row.idempotency_required else None,
        ),
        execution=Execution(
            supports_sync=True,
            supports_async=row.supports_async,
            supports_streaming=row.streaming,
            supports_cancel=row.streaming,
            supports_retry=row.retry,
            expected_completion=row.completion,
            retry_safety="safe" if row.read_only else "unsafe",
        ),
        data=DataPolicy(
            sensitivity=row.sensitivity,
            contains_pii=not row.read_only,
            redaction_required=row.name not in DISCOVERY,
        ),
        approval=(
            ApprovalPolicy(
                required=True,
                approver_selector=TenantPolicySelector(),
                reason=f"Hermes Agent `{row.name}` changes protected or destructive state.",
                ttl_ms=APPROVAL_TTL_MS,
                evidence_requirements=["reason", "input_snapshot", "policy_decision"],
            )
            if row.approval
            else None
        ),
        sla=Sla(
            async_expected=row.name in ("run_start", "run_events", "operator"),
            expected_latency_ms=30_000 if streaming_op or row.name == "operator" else 5_000,
            timeout_ms=row.sla_timeout_ms,
            max_queue_delay_ms=10_000,
            availability_target="99.9%",
        ),
        compensation=Compensation(mode="rollback_not_supported", requires_approval=row.approval),
    )
