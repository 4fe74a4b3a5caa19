"""The 35 operations' contracts (worker/operations/catalog.py) against the reference Hermes
connector's table and rules, typed here from shared/reference/aip-1.0-wire.md §4.2 (not
read from the catalog): every value the reference gives, and every departure documented."""

from __future__ import annotations

import msgspec
import pytest

from schemas.aip.manifest import CapabilityContract
from worker.operations.catalog import BY_NAME, ROWS, contract, reference_row

REFERENCE_OPERATIONS = [
    "health", "health_detailed", "models", "capabilities", "skills", "toolsets",
    "chat", "chat_stream", "responses", "responses_stream", "response_get", "response_delete",
    "run_start", "run_status", "run_events", "run_approval", "run_stop", "operator",
    "sessions_list", "session_create", "session_get", "session_patch", "session_delete",
    "session_messages", "session_fork", "session_chat", "session_chat_stream",
    "jobs_list", "job_create", "job_get", "job_update", "job_delete", "job_pause",
    "job_resume", "job_run",
]  # fmt: skip
#: The reference's `appr` = yes rows.
REFERENCE_APPROVAL = {
    "response_delete", "run_approval", "run_stop", "operator", "session_delete",
    "job_create", "job_update", "job_delete", "job_pause", "job_resume", "job_run",
}  # fmt: skip
#: The reference's `idem` = R rows.
REFERENCE_KEY_REQUIRED = {
    "response_delete", "run_start", "run_approval", "run_stop", "operator", "session_create",
    "session_patch", "session_delete", "session_fork", "job_create", "job_update",
    "job_delete", "job_pause", "job_resume", "job_run",
}  # fmt: skip
REFERENCE_STREAMING = {"chat_stream", "responses_stream", "run_events", "operator",
                       "session_chat_stream"}  # fmt: skip
REFERENCE_ASYNC = {"chat_stream", "responses_stream", "run_start", "run_events", "operator"}
REFERENCE_RESTRICTED = {"response_delete", "run_approval", "run_stop", "session_delete",
                        "job_delete"}  # fmt: skip
REFERENCE_EXPERIMENTAL = {"skills", "toolsets", "response_get", "response_delete"}


def test_the_catalog_has_exactly_the_reference_operations_in_order() -> None:
    assert [row.name for row in ROWS] == REFERENCE_OPERATIONS


@pytest.mark.parametrize("name", REFERENCE_OPERATIONS)
def test_each_row_undone_of_its_departures_is_the_reference_row(name: str) -> None:
    row = reference_row(BY_NAME[name])
    assert row.approval is (name in REFERENCE_APPROVAL)
    assert row.idempotency_required is (name in REFERENCE_KEY_REQUIRED)
    assert row.streaming is (name in REFERENCE_STREAMING)
    assert row.supports_async is (name in REFERENCE_ASYNC)
    assert row.stable is (name not in REFERENCE_EXPERIMENTAL)
    assert (row.sensitivity == "restricted") is (name in REFERENCE_RESTRICTED)
    assert row.retry is row.read_only
    assert ("delete" in row.side_effects) is (
        name in {"response_delete", "session_delete", "job_delete"}
    )
    assert row.sla_timeout_ms == (
        900_000 if name == "operator" else 300_000 if name in REFERENCE_STREAMING else 60_000
    )


def test_the_read_only_set_is_the_fourteen_low_rows() -> None:
    low = {row.name for row in ROWS if reference_row(row).read_only}
    assert len(low) == 14
    assert all(set(BY_NAME[name].side_effects) == {"read", "external_network"} for name in low)


def test_every_departure_is_stricter_and_has_a_reason() -> None:
    for row in ROWS:
        upstream = reference_row(row)
        if row == upstream:
            continue
        assert row.stricter, row.name
        order = ["low", "medium", "high", "critical"]
        assert order.index(row.risk) >= order.index(upstream.risk), row.name
        assert row.approval >= upstream.approval, row.name
        assert row.idempotency_required >= upstream.idempotency_required, row.name


@pytest.mark.parametrize("name", REFERENCE_OPERATIONS)
def test_each_contract_follows_the_reference_rules(name: str) -> None:
    row = BY_NAME[name]
    built = contract(row)
    decoded = msgspec.json.decode(msgspec.json.encode(built), type=CapabilityContract)
    assert decoded == built
    assert built.idempotency.collision_behavior == "return_original_result"
    assert built.idempotency.key_scope == "capability"
    assert built.idempotency.ttl_ms == (86_400_000 if row.idempotency_required else None)
    assert built.execution.supports_sync is True
    assert built.execution.supports_cancel is built.execution.supports_streaming
    assert built.execution.retry_safety == ("safe" if row.read_only else "unsafe")
    assert built.data.contains_pii is (not row.read_only)
    assert built.data.redaction_required is (
        name not in {"health", "health_detailed", "models", "capabilities", "skills", "toolsets"}
    )
    assert built.sla is not None
    assert built.sla.async_expected is (name in {"run_start", "run_events", "operator"})
    assert built.sla.max_queue_delay_ms == 10_000
    assert built.transaction is None
    assert built.compensation is not None
    assert built.compensation.mode == "rollback_not_supported"
    assert built.compensation.requires_approval is row.approval
    if row.approval:
        assert built.approval is not None
        assert built.approval.ttl_ms == 900_000
        assert built.approval.evidence_requirements == [
            "reason", "input_snapshot", "policy_decision",
        ]  # fmt: skip
    else:
        assert built.approval is None


def test_mutating_operations_require_a_key_here_as_the_enterprise_rule_asks() -> None:
    """AIP's enterprise contract rule: mutating side effects need idempotency `required`.
    The reference connector leaves it optional on its turns; this project does not."""
    for row in ROWS:
        if {"write", "delete"} & set(row.side_effects):
            assert contract(row).idempotency.requirement == "required", row.name
