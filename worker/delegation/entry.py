"""The internal operator Action a delegation is executed as (see `worker.delegation.action_id`).

The runtime leases, fences, settles and publishes Actions; a delegation reuses all of it by
becoming one: the operator capability of its endpoint, the delegator's identity (checked
against the identity directory like any principal), the delegation chain, and the whole
request as its input, so the fingerprint that detects a reused id covers the exact child.
"""

from __future__ import annotations

import msgspec

from schemas.action import Action, DelegationRef
from schemas.delegation import DelegationRequest
from schemas.ids import capability_id
from worker.delegation.action_id import delegation_action_id


def internal_action(request: DelegationRequest, endpoint_id: str) -> Action:
    child = request.action
    deadlines = [d for d in (request.deadline_unix_ms, child.deadline_unix_ms) if d is not None]
    action_id = delegation_action_id(request.delegation_id)
    return Action(
        id=action_id,
        capability=capability_id(endpoint_id, "operator"),
        input={"delegation": msgspec.to_builtins(request)},
        identity=request.delegator,
        created_at_unix_ms=request.created_at_unix_ms,
        mode=child.mode,
        # Hermes ignores it on /v1/runs; it still names this delegation, not the child.
        idempotency_key=action_id,
        deadline_unix_ms=min(deadlines) if deadlines else None,
        trace=child.trace,
        # The request's own approval reference is checked for the child by the handler
        # (`TrustGate.check_delegated_child`); this Action carries no decision of its own.
        delegation=DelegationRef(
            delegation_id=request.delegation_id,
            parent_action_id=child.delegation.parent_action_id if child.delegation else None,
            chain=list(request.chain),
        ),
    )
