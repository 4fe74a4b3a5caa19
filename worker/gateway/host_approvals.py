"""The central's approval authorization on a connector host route (aip-1.0-wire.md §3.6).

A GetAIP central that routes an approved Action to this host pins, in
`security.connector_route.approval_authorization`, its own durable approval record (the
reference runtime's `ApprovalRecord`: the `request`, its `status`, the final `decision`, the
`decisions` that led there, and two timestamps). The reference host checks it in two places,
and so does this one:

1. with the route (`check_route_authorization`, a refusal is `connector_host.route_mismatch`,
   403): an Action with an approval must bring a record and a record needs an approval; only
   an Action may bring one; the record must decode, be `approved`, carry exactly the Action's
   `approval` as its final decision, name this Action, its capability and this host's tenant,
   agree with the approval's policy hash, and be importable: every recorded decision an
   approval of this request under the same policy hash;
2. after the credential revision (`HostApprovalImports.record`): the record is kept, by the
   hash of its canonical JSON, in the JetStream key-value bucket `AIP_HOST_APPROVALS` under
   its request id. The same record again is accepted; another record for the same request id
   is `connector_host.approval_authorization_conflict` (403); a bucket that cannot answer is
   `connector_host.approval_authorization_unavailable` (503, retryable after 1 s).

What stays stricter here than the reference (docs/aip.md): the central's record is checked
and remembered, never made authority. The workers still require this pool's own approval
authority's signed records for a capability that needs approval
(worker/trust/approval_ledger.py), so an Action the central approved but this pool's
authority did not is refused by the worker, as any Action without those records is.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec
from nats.errors import Error as NatsError
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from schemas.aip.action import Action as AipAction
from schemas.aip.approval import ApprovalDecision, ApprovalRequest
from schemas.errors import ErrorCategory, ErrorCode
from worker.aip.canonical import canonical_bytes
from worker.errors import NativeRefusal
from worker.gateway.native_trust import open_bucket

BUCKET: Final = "AIP_HOST_APPROVALS"
#: How long an imported record is remembered: a day, as long as a result is kept.
TTL_S: Final = 86_400
#: The reference's retry hint for an approval journal that cannot answer.
UNAVAILABLE_RETRY_MS: Final = 1_000
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class VerifiedDecision(msgspec.Struct, frozen=True):
    """One decision the central verified: the decision, the approver's authority
    membership (kept as the central wrote it; this host does not resolve the central's
    directory), the hash of its evidence, and when it was recorded."""

    decision: ApprovalDecision
    authority: dict[str, Any]
    evidence_hash: str
    recorded_at: Any


class CentralApprovalRecord(msgspec.Struct, frozen=True):
    """The central runtime's approval record as it serializes it. Fields it may add later
    are ignored, as the reference's decoder ignores them; the request and decisions inside
    are closed AIP objects."""

    request: ApprovalRequest
    status: Literal["pending", "approved", "denied", "expired", "revoked"]
    created_at: Any
    updated_at: Any
    decision: ApprovalDecision | None = None
    decisions: list[VerifiedDecision] = msgspec.field(default_factory=list)


def _mismatch(message: str) -> NativeRefusal:
    return NativeRefusal(
        ErrorCode.HOST_ROUTE_MISMATCH.value,
        f"approval authorization: {message}",
        ErrorCategory.AUTH,
    )


def check_route_authorization(
    body: object, route: Mapping[str, Any], tenant_id: str | None
) -> CentralApprovalRecord | None:
    """The route step's checks (module docstring, 1.): the decoded record of an approved
    Action, None when neither the Action nor the route names an approval."""
    raw = route.get("approval_authorization")
    if not isinstance(body, AipAction):
        if raw is not None:
            raise _mismatch("is valid only for an action")
        return None
    approval = body.approval
    if approval is None and raw is None:
        return None
    if approval is None:
        raise _mismatch("the route carries an unused approval authorization")
    if raw is None:
        raise _mismatch("the approved Action is missing the gateway's authorization evidence")
    try:
        record = msgspec.convert(raw, CentralApprovalRecord, strict=True)
    except msgspec.ValidationError:
        raise _mismatch("is malformed") from None
    request = record.request
    tenant = request.identity.tenant if request.identity is not None else None
    if (
        approval.decision != "approved"
        or record.status != "approved"
        or record.decision != approval
        or request.id != approval.approval_id
        or request.action_id != body.id
        or request.capability_id != body.capability_id
        or tenant is None
        or tenant_id is None
        or tenant.id != tenant_id
        or approval.policy_hash != request.policy_hash
    ):
        raise _mismatch("does not match the action, tenant, policy, or terminal decision")
    if not record.decisions or any(
        entry.decision.decision != "approved"
        or entry.decision.approval_id != request.id
        or entry.decision.policy_hash != request.policy_hash
        or not _SHA256_HEX.fullmatch(entry.evidence_hash)
        for entry in record.decisions
    ):
        raise _mismatch("cannot reproduce its approved policy")
    return record


class HostApprovalImports:
    """Each imported record by request id, durably (module docstring, 2.)."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: Any, *, replicas: int = 1) -> HostApprovalImports:
        description = "connector host: the central's approval record of each approval id"
        return cls(await open_bucket(js, BUCKET, TTL_S, description, replicas))

    async def record(self, record: CentralApprovalRecord) -> None:
        """Keep `record` under its request id; the same record again is fine, another one
        is a conflict, and a bucket that cannot answer makes the request retryable."""
        key = hashlib.sha256(record.request.id.encode("utf-8")).hexdigest()
        digest = hashlib.sha256(canonical_bytes(msgspec.to_builtins(record))).hexdigest()
        try:
            try:
                await self.kv.create(key, digest.encode("ascii"))
                return
            except KeyWrongLastSequenceError:
                entry = await self.kv.get(key)
        except (NatsError, TimeoutError, OSError) as exc:
            raise NativeRefusal(
                ErrorCode.HOST_APPROVAL_AUTHORIZATION_UNAVAILABLE.value,
                f"the approval journal cannot answer ({type(exc).__name__})",
                ErrorCategory.TEMPORARY,
                retryable=True,
                retry_after_ms=UNAVAILABLE_RETRY_MS,
            ) from None
        if (entry.value or b"").decode("ascii", "replace") != digest:
            raise NativeRefusal(
                ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT.value,
                "another approval record was already imported for this approval id",
                ErrorCategory.AUTH,
            )
