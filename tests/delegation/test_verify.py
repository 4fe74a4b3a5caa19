"""Every invariant of "Verify the delegated result", one broken at a time (spec item 9)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from schemas.action import Identity
from schemas.delegation import ChildAction, DelegationRequest
from schemas.errors import ErrorCode
from schemas.lifecycle import (
    AuthenticatedPrincipal,
    ChildResult,
    LifecycleRecord,
    LifecycleState,
    QueueRecord,
)
from worker.delegation.verify import IMMUTABLE_FIELDS, verify_child
from worker.errors import ConnectorError

from .support import make_request, now_ms

TENANT = "tenant-a"


def authenticated(request: DelegationRequest, **changes: Any) -> AuthenticatedPrincipal:
    principal = AuthenticatedPrincipal(
        principal_id=request.delegate,
        principal_kind="agent",
        tenant_id=TENANT,
        authentication_issuer="https://mcp.example.test",
        credential_revision=1,
        scopes=["action:write", "mcp:connect"],
        expires_at_unix_ms=now_ms() + 60_000,
    )
    return msgspec.structs.replace(principal, **changes)


def observed_child(request: DelegationRequest, auth: AuthenticatedPrincipal) -> ChildAction:
    return msgspec.structs.replace(
        request.action,
        identity=Identity(
            principal_id=auth.principal_id,
            principal_kind=auth.principal_kind,
            tenant_id=auth.tenant_id,
            authentication_issuer=auth.authentication_issuer,
            credential_revision=auth.credential_revision,
        ),
    )


def records(
    request: DelegationRequest,
    *,
    state: LifecycleState = LifecycleState.COMPLETED,
    lifecycle_state: LifecycleState | None = None,
    auth: AuthenticatedPrincipal | None = None,
    child: ChildAction | None = None,
    result: ChildResult | bool | None = True,
    **queue_changes: Any,
) -> tuple[QueueRecord, LifecycleRecord | None]:
    auth = auth or authenticated(request)
    child = child or observed_child(request, auth)
    queue = QueueRecord(
        action=child,
        owner_principal_id=request.delegate,
        authenticated=auth,
        actor_principal_id=request.delegate,
        tenant_partition=TENANT,
        state=state,
        enqueued_at_unix_ms=now_ms(),
        updated_at_unix_ms=now_ms(),
    )
    queue = msgspec.structs.replace(queue, **queue_changes)
    recorded = lifecycle_state or state
    if result is True:
        result = ChildResult(
            action_id=request.action.id,
            capability=request.action.capability,
            status=recorded.value,
            output={"summary": "native"},
            settled_at_unix_ms=now_ms(),
        )
    lifecycle = LifecycleRecord(
        action_id=request.action.id,
        state=recorded,
        result=result or None,
        updated_at_unix_ms=now_ms(),
    )
    return queue, lifecycle


def verify(
    request: DelegationRequest, queue: QueueRecord, lifecycle: LifecycleRecord | None
) -> ChildResult | None:
    return verify_child(
        request.action,
        delegate=request.delegate,
        tenant_id=TENANT,
        queue=queue,
        lifecycle=lifecycle,
        now_ms=now_ms(),
    )


def refused(request: DelegationRequest, queue: QueueRecord, lifecycle: Any) -> ErrorCode:
    with pytest.raises(ConnectorError) as caught:
        verify(request, queue, lifecycle)
    return caught.value.code


def test_an_exact_native_child_is_the_result() -> None:
    request = make_request(tenant_id=TENANT)
    result = verify(request, *records(request))
    assert result is not None
    assert result.action_id == request.action.id
    assert result.output == {"summary": "native"}


def test_a_live_child_is_not_ready_yet() -> None:
    request = make_request(tenant_id=TENANT)
    for state in (LifecycleState.QUEUED, LifecycleState.RUNNING):
        queue, _ = records(request, state=state)
        assert verify(request, queue, None) is None
    # The runtime writes the durable result first, then marks the queue entry terminal.
    queue, lifecycle = records(
        request, state=LifecycleState.RUNNING, lifecycle_state=LifecycleState.COMPLETED
    )
    assert verify(request, queue, lifecycle) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id", "act_" + "0" * 32),
        ("capability", "cap:support_sandbox:case.delete"),
        ("input", {"case_id": "other"}),
        ("mode", "sync"),
        ("idempotency_key", "idem-other"),
        ("timeout_ms", 1),
        ("conversation", {"thread": "t-2"}),
        ("federation", {"peer": "x"}),
        ("callback", {"url": "x"}),
        ("observability", {"x": 1}),
        ("compliance", {"x": 1}),
        (
            "approval",
            {
                "approval_id": "appr_" + "1" * 32,
                "decision": "approved",
                "approver": {"id": "approver:x", "kind": "human"},
                "decided_at": "2026-01-01T00:00:00Z",
            },
        ),
        ("transaction", {"x": 1}),
        ("delegation", {"delegation_id": "dlg-other", "chain": ["user:demo"]}),
    ],
)
def test_an_altered_contract_field_is_a_contract_mismatch(field: str, value: Any) -> None:
    request = make_request(tenant_id=TENANT)
    auth = authenticated(request)
    document = msgspec.to_builtins(observed_child(request, auth))
    document[field] = value
    child = msgspec.convert(document, ChildAction)
    queue, lifecycle = records(request, auth=auth, child=child)
    assert refused(request, queue, lifecycle) is ErrorCode.DELEGATED_ACTION_CONTRACT_MISMATCH


def test_every_listed_immutable_field_exists_on_the_action() -> None:
    assert set(IMMUTABLE_FIELDS) <= set(ChildAction.__struct_fields__)
    assert "delegation" in IMMUTABLE_FIELDS


def test_memory_may_gain_trusted_enrichment_but_not_change() -> None:
    request = make_request(tenant_id=TENANT)
    auth = authenticated(request)
    base = observed_child(request, auth)
    enriched = msgspec.structs.replace(base, memory={**(base.memory or {}), "_aip": {"t": 1}})
    assert verify(request, *records(request, auth=auth, child=enriched)) is not None
    changed = msgspec.structs.replace(base, memory={"notes": ["rewritten"]})
    queue, lifecycle = records(request, auth=auth, child=changed)
    assert refused(request, queue, lifecycle) is ErrorCode.DELEGATED_ACTION_CONTRACT_MISMATCH


@pytest.mark.parametrize(
    ("auth_changes", "code"),
    [
        ({"expires_at_unix_ms": 1}, ErrorCode.DELEGATED_IDENTITY_UNVERIFIED),
        ({"scopes": ["mcp:connect"]}, ErrorCode.DELEGATED_IDENTITY_UNVERIFIED),
        ({"tenant_expires_at_unix_ms": 1}, ErrorCode.DELEGATED_TENANT_EXPIRED),
    ],
)
def test_authentication_must_be_current_and_hold_action_write(
    auth_changes: dict[str, Any], code: ErrorCode
) -> None:
    request = make_request(tenant_id=TENANT)
    auth = authenticated(request, **auth_changes)
    queue, lifecycle = records(request, auth=auth)
    assert refused(request, queue, lifecycle) is code


def test_authority_is_judged_when_the_child_was_enqueued() -> None:
    request = make_request(tenant_id=TENANT)
    enqueued = now_ms() - 10_000
    # Valid when the child was created, expired since: the child stands.
    auth = authenticated(request, expires_at_unix_ms=enqueued + 1_000)
    queue, lifecycle = records(request, auth=auth, enqueued_at_unix_ms=enqueued)
    assert verify(request, queue, lifecycle) is not None
    # Already expired when the child was created: not authenticated.
    auth = authenticated(request, expires_at_unix_ms=enqueued - 1)
    queue, lifecycle = records(request, auth=auth, enqueued_at_unix_ms=enqueued)
    assert refused(request, queue, lifecycle) is ErrorCode.DELEGATED_IDENTITY_UNVERIFIED


def test_the_creator_must_be_an_agent_principal() -> None:
    request = make_request(tenant_id=TENANT)
    auth = authenticated(request, principal_kind="user")
    queue, lifecycle = records(request, auth=auth, child=observed_child(request, auth))
    assert refused(request, queue, lifecycle) is ErrorCode.DELEGATED_IDENTITY_MISMATCH


def test_the_first_broken_invariant_in_the_spec_order_decides() -> None:
    request = make_request(tenant_id=TENANT)
    auth = authenticated(request, scopes=[], principal_id="agent:other")
    document = msgspec.to_builtins(observed_child(request, auth))
    document["input"] = {"changed": True}
    queue, lifecycle = records(
        request,
        auth=auth,
        child=msgspec.convert(document, ChildAction),
        tenant_partition="tenant-b",
        lifecycle_state=LifecycleState.FAILED,
    )
    assert refused(request, queue, lifecycle) is ErrorCode.DELEGATED_ACTION_CONTRACT_MISMATCH


@pytest.mark.parametrize("role", ["owner_principal_id", "actor_principal_id"])
def test_a_forged_owner_or_actor_is_an_identity_mismatch(role: str) -> None:
    request = make_request(tenant_id=TENANT)
    queue, lifecycle = records(request, **{role: "agent:intruder"})
    assert refused(request, queue, lifecycle) is ErrorCode.DELEGATED_IDENTITY_MISMATCH


def test_a_child_created_by_another_principal_is_an_identity_mismatch() -> None:
    request = make_request(tenant_id=TENANT)
    auth = authenticated(request, principal_id="agent:hermes_operator:other")
    queue, lifecycle = records(request, auth=auth, child=observed_child(request, auth))
    assert refused(request, queue, lifecycle) is ErrorCode.DELEGATED_IDENTITY_MISMATCH


def test_an_identity_other_than_the_authenticated_one_is_an_integrity_failure() -> None:
    request = make_request(tenant_id=TENANT)
    auth = authenticated(request)
    child = observed_child(request, auth)
    child = msgspec.structs.replace(
        child, identity=msgspec.structs.replace(child.identity, credential_revision=7)
    )
    queue, lifecycle = records(request, auth=auth, child=child)
    assert refused(request, queue, lifecycle) is ErrorCode.DELEGATED_IDENTITY_INTEGRITY


def test_tenant_drift_is_refused() -> None:
    request = make_request(tenant_id=TENANT)
    queue, lifecycle = records(request, tenant_partition="tenant-b")
    assert refused(request, queue, lifecycle) is ErrorCode.DELEGATED_TENANT_MISMATCH
    auth = authenticated(request, tenant_id="tenant-b")
    queue, lifecycle = records(request, auth=auth, child=observed_child(request, auth))
    assert refused(request, queue, lifecycle) is ErrorCode.DELEGATED_TENANT_MISMATCH


def test_disagreeing_or_incomplete_stores_fail_closed() -> None:
    request = make_request(tenant_id=TENANT)
    integrity = ErrorCode.DELEGATED_RESULT_INTEGRITY
    queue, lifecycle = records(request, lifecycle_state=LifecycleState.FAILED)
    assert refused(request, queue, lifecycle) is integrity
    queue, _ = records(request)
    assert refused(request, queue, None) is integrity
    queue, lifecycle = records(request, lifecycle_state=LifecycleState.RUNNING)
    assert refused(request, queue, lifecycle) is integrity
    queue, lifecycle = records(request, result=False)
    assert refused(request, queue, lifecycle) is integrity


def test_the_terminal_result_must_name_the_expected_child() -> None:
    request = make_request(tenant_id=TENANT)
    integrity = ErrorCode.DELEGATED_RESULT_INTEGRITY
    queue, lifecycle = records(request)
    assert lifecycle is not None
    assert lifecycle.result is not None
    wrong_id = msgspec.structs.replace(
        lifecycle, result=msgspec.structs.replace(lifecycle.result, action_id="act_" + "2" * 32)
    )
    assert refused(request, queue, wrong_id) is integrity
    other_record = msgspec.structs.replace(lifecycle, action_id="act_" + "3" * 32)
    assert refused(request, queue, other_record) is integrity
    wrong_status = msgspec.structs.replace(
        lifecycle, result=msgspec.structs.replace(lifecycle.result, status="failed")
    )
    assert refused(request, queue, wrong_status) is integrity
    wrong_capability = msgspec.structs.replace(
        lifecycle,
        result=msgspec.structs.replace(
            lifecycle.result, capability="cap:support_sandbox:case.delete"
        ),
    )
    assert refused(request, queue, wrong_capability) is integrity
