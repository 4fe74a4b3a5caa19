"""Verify one delegated child against the recorded request (spec "Verify the delegated result").

A pure function over the two store records, so every invariant is tested on its own. The
checks run in the spec's order and the first broken one decides the typed code:

1. the immutable contract (id, capability, input, mode, idempotency, timeout, conversation,
   delegation, federation, callback, observability, compliance, approval, transaction)
   -> `delegated_action_contract_mismatch`;
2. application memory, allowing trusted `_aip` enrichment -> the same code;
3. a transport-authenticated principal holding `action:write`, not expired when the child
   was enqueued -> `delegated_identity_unverified`;
4. the expected Hermes (Agent) principal as queue owner, authenticated owner and actor
   -> `delegated_identity_mismatch`;
5. the Action's identity equal to the resolved trusted identity -> `delegated_identity_integrity`;
6. the exact valid tenant partition -> `delegated_tenant_mismatch` / `delegated_tenant_expired`;
7. queue and lifecycle agreeing, a terminal queue entry with a durable terminal result
   -> `delegated_result_integrity` (the runtime writes the lifecycle result first, then
   marks the queue entry terminal; a live queue entry is "not ready" whatever the other says);
8. the expected child Action id on the terminal result -> `delegated_result_integrity`.

A child that is queued or running in both stores is not an error: `None` says "not ready".
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.delegation import ACTION_WRITE_SCOPE, AGENT_KIND, ChildAction
from schemas.errors import ErrorCode
from schemas.lifecycle import ChildResult, LifecycleRecord, QueueRecord
from worker.errors import ConnectorError

#: Spec item 1, in its order.
IMMUTABLE_FIELDS = (
    "id",
    "capability",
    "input",
    "mode",
    "idempotency_key",
    "timeout_ms",
    "conversation",
    "delegation",
    "federation",
    "callback",
    "observability",
    "compliance",
    "approval",
    "transaction",
)
#: The one memory key the runtime may add or change (trusted enrichment).
TRUSTED_MEMORY_KEY = "_aip"


def _fail(code: ErrorCode, message: str) -> ConnectorError:
    return ConnectorError(code, f"delegated result refused: {message}")


def _plain(value: Any) -> Any:
    return msgspec.to_builtins(value)


def verify_child(
    expected: ChildAction,
    *,
    delegate: str,
    tenant_id: str | None,
    queue: QueueRecord,
    lifecycle: LifecycleRecord | None,
    now_ms: int,
) -> ChildResult | None:
    """The verified native result, None while the child is not terminal; raises ConnectorError.

    `delegate` is the Hermes principal that must own and have created the child; `tenant_id`
    the tenant partition it must live in (the endpoint's, else the delegator's verified one).
    """
    observed = queue.action
    drifted = [
        name
        for name in IMMUTABLE_FIELDS
        if _plain(getattr(observed, name)) != _plain(getattr(expected, name))
    ]
    if drifted:
        raise _fail(
            ErrorCode.DELEGATED_ACTION_CONTRACT_MISMATCH,
            "the child Action differs from the delegated contract in " + ", ".join(drifted),
        )
    if _memory(observed.memory) != _memory(expected.memory):
        raise _fail(
            ErrorCode.DELEGATED_ACTION_CONTRACT_MISMATCH,
            "the child Action's application memory differs from the delegated contract",
        )
    authenticated = queue.authenticated
    # Authority is judged when the child was created: a later expiry does not undo it.
    created_ms = min(queue.enqueued_at_unix_ms, now_ms)
    if authenticated.expires_at_unix_ms <= created_ms:
        raise _fail(
            ErrorCode.DELEGATED_IDENTITY_UNVERIFIED,
            "the transport authentication that created the child has expired",
        )
    if ACTION_WRITE_SCOPE not in authenticated.scopes:
        raise _fail(
            ErrorCode.DELEGATED_IDENTITY_UNVERIFIED,
            f"the authenticated creator of the child lacks {ACTION_WRITE_SCOPE}",
        )
    owners = {
        "queue owner": queue.owner_principal_id,
        "authenticated owner": authenticated.principal_id,
        "actor": queue.actor_principal_id,
    }
    wrong = [role for role, principal in owners.items() if principal != delegate]
    if authenticated.principal_kind != AGENT_KIND:
        wrong.append("principal kind")
    if wrong:
        raise _fail(
            ErrorCode.DELEGATED_IDENTITY_MISMATCH,
            f"the child was not created by {delegate} (" + ", ".join(wrong) + " differ)",
        )
    identity = observed.identity
    trusted = (
        authenticated.principal_id,
        authenticated.principal_kind,
        authenticated.tenant_id,
        authenticated.authentication_issuer,
        authenticated.credential_revision,
    )
    claimed = (
        identity.principal_id,
        identity.principal_kind,
        identity.tenant_id,
        identity.authentication_issuer,
        identity.credential_revision,
    )
    if claimed != trusted:
        raise _fail(
            ErrorCode.DELEGATED_IDENTITY_INTEGRITY,
            "the child Action's identity is not the transport-authenticated identity",
        )
    if queue.tenant_partition != tenant_id or authenticated.tenant_id != tenant_id:
        raise _fail(
            ErrorCode.DELEGATED_TENANT_MISMATCH,
            "the child lives in another tenant partition than the delegation",
        )
    tenant_expiry = authenticated.tenant_expires_at_unix_ms
    if tenant_expiry is not None and tenant_expiry <= created_ms:
        raise _fail(
            ErrorCode.DELEGATED_TENANT_EXPIRED,
            "the creator's membership of the tenant has expired",
        )
    return _settled_result(expected, queue, lifecycle)


def _memory(memory: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (memory or {}).items() if k != TRUSTED_MEMORY_KEY}


def _settled_result(
    expected: ChildAction, queue: QueueRecord, lifecycle: LifecycleRecord | None
) -> ChildResult | None:
    integrity = ErrorCode.DELEGATED_RESULT_INTEGRITY
    if lifecycle is not None and lifecycle.action_id != expected.id:
        raise _fail(integrity, "the lifecycle record names another Action id")
    lifecycle_terminal = lifecycle is not None and lifecycle.state.terminal
    if not queue.state.terminal:
        # The runtime records the durable result before it marks the queue entry terminal,
        # so a terminal lifecycle under a live queue entry is a write in progress: wait.
        return None
    if lifecycle is None or not lifecycle_terminal:
        raise _fail(integrity, "the queue entry is terminal without a terminal lifecycle record")
    if lifecycle.state is not queue.state:
        raise _fail(
            integrity,
            f"the queue says {queue.state.value}, the lifecycle {lifecycle.state.value}",
        )
    result = lifecycle.result
    if result is None:
        raise _fail(integrity, "the terminal lifecycle record holds no durable result")
    if result.action_id != expected.id:
        raise _fail(integrity, "the terminal result names another child Action id")
    if result.capability != expected.capability or result.status != lifecycle.state.value:
        raise _fail(integrity, "the terminal result disagrees with the lifecycle record")
    return result
