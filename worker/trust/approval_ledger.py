"""The approval ledger: recording a decision, and the check an approved run must pass.

Only a record at `approvals_key(action_id)` authorizes an approval-governed capability; the
Action's `approval.decision_id`, anything in `input` or a legacy `_aip` field are claims, and
claims grant nothing. The records themselves are read and written in `worker.store.approvals`.
Refusal codes when the check fails:

- `connector_host.approval_authorization_unavailable`: no authority file is configured, no
  decision is recorded, the decision expired, or Redis could not be read;
- `connector_host.approval_authorization_conflict`: the record is not signed by the key
  its approver's membership names (a record written to Redis by anyone else: no signature,
  a bad one, or another member's key); it is for another action, capability, input or
  tenant; it is a denial; the Action's `decision_id` is not the record's; or the approver
  is no longer authorized (membership gone, expired, or at another revision).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import msgspec

from schemas.action import Action
from schemas.approval import (
    MAX_INPUT_SNAPSHOT_BYTES,
    MAX_REASON_CHARS,
    ApprovalDecision,
    ApprovalRecord,
    PolicyDecision,
)
from schemas.errors import ErrorCode
from worker.errors import ApprovalRefused, ConnectorError, NotAuthorized
from worker.fingerprints import approval_fingerprint, canonical_request
from worker.store.approvals import ApprovalRecords, DecisionWrite, StoredDecision
from worker.store.clock import Clock, RedisClock, redis_now_ms
from worker.trust.authority import ApprovalAuthority
from worker.trust.files import describe_principal
from worker.trust.signing import public_key_of, sign_detached, verify_detached

#: The operator's approval policy: a decision lasts 15 minutes (operator-and-delegation).
DEFAULT_APPROVAL_TTL_MS = 15 * 60 * 1_000
MAX_APPROVAL_TTL_MS = 24 * 3_600 * 1_000
_encoder = msgspec.json.Encoder()


def new_decision_id() -> str:
    return "apr_" + secrets.token_hex(16)


def input_snapshot(action: Action) -> tuple[str, bool]:
    """Canonical JSON of {capability, input} for people, cut on a character boundary."""
    text = canonical_request(action.capability, action.input).decode()
    encoded = text.encode()
    if len(encoded) <= MAX_INPUT_SNAPSHOT_BYTES:
        return text, False
    return encoded[:MAX_INPUT_SNAPSHOT_BYTES].decode("utf-8", errors="ignore"), True


@dataclass(frozen=True, slots=True)
class RecordRead:
    """One read of an Action's approval record, or the error the read raised: taken early
    (its Redis time serves the whole admission) and judged at the approval step."""

    stored: StoredDecision | None
    error: ConnectorError | None = None


async def prefetch_record(
    records: ApprovalRecords, action_id: str, clock: RedisClock
) -> RecordRead:
    """Read the record now and give its Redis time to `clock`; a failure is kept, not raised."""
    try:
        stored, read_at = await records.read_at(action_id)
    except ConnectorError as exc:
        return RecordRead(None, exc)
    clock.offer(read_at)
    return RecordRead(stored)


async def approve(
    redis: Any,
    authority: ApprovalAuthority,
    action: Action,
    as_principal: str,
    reason: str,
    decision: ApprovalDecision,
    *,
    seed: bytes,
    ttl_ms: int = DEFAULT_APPROVAL_TTL_MS,
) -> ApprovalRecord:
    """Record `as_principal`'s decision on exactly this Action request, signed with `seed`.

    The approver must hold a live membership for the Action's tenant whose capability
    prefixes cover its capability and whose `public_key` is `seed`'s, and may not decide on
    an Action of its own principal (the point of approval is a second party). Raises
    ApprovalRefused otherwise, or when a live decision already exists for the Action.
    """
    reason = reason.strip()
    if not reason or len(reason) > MAX_REASON_CHARS:
        raise ApprovalRefused(f"a reason of 1 to {MAX_REASON_CHARS} characters is required")
    if not 1 <= ttl_ms <= MAX_APPROVAL_TTL_MS:
        raise ApprovalRefused(f"ttl must be between 1 ms and {MAX_APPROVAL_TTL_MS} ms")
    if as_principal == action.identity.principal_id:
        raise ApprovalRefused("an approver may not decide on an Action of its own principal")
    now = await redis_now_ms(redis)
    tenant_id = action.identity.tenant_id
    try:
        match = authority.authorize(
            principal_id=as_principal, tenant_id=tenant_id, capability=action.capability, now_ms=now
        )
    except NotAuthorized as exc:
        raise ApprovalRefused(str(exc)) from None
    try:
        signer = public_key_of(seed)
    except ValueError as exc:
        raise ApprovalRefused(f"--key: {exc}") from None
    if signer != match.membership.public_key:
        raise ApprovalRefused(
            f"the key {signer} is not the approval key of {describe_principal(as_principal)} "
            "(its membership's public_key)"
        )
    records = ApprovalRecords(redis)
    read_revision = await records.revision(action.id)
    snapshot, truncated = input_snapshot(action)
    membership = match.membership
    record = ApprovalRecord(
        decision_id=new_decision_id(),
        action_id=action.id,
        capability=action.capability,
        input_fingerprint=approval_fingerprint(action),
        decision=decision,
        approver_principal_id=as_principal,
        approver_revision=membership.revision,
        tenant_id=tenant_id,
        reason=reason,
        input_snapshot=snapshot,
        input_snapshot_truncated=truncated,
        policy_decision=PolicyDecision(
            authority_file_sha256=authority.sha256,
            membership_principal_id=membership.principal_id,
            membership_revision=membership.revision,
            membership_tenant_id=membership.tenant_id,
            matched_capability_prefix=match.matched_prefix,
            ttl_ms=ttl_ms,
            evaluated_at_unix_ms=now,
        ),
        created_at_unix_ms=now,
        expires_at_unix_ms=now + ttl_ms,
        revision=read_revision + 1,
    )
    signed = _encoder.encode(record)
    status, stored = await records.write(
        record, signed, sign_detached(signed, seed), signer, read_revision=read_revision
    )
    if status in (DecisionWrite.WRITTEN, DecisionWrite.EXISTS):
        return record
    if status is DecisionWrite.CONFLICT:
        existing = stored
        what = (
            f"{existing.decision_id} ({existing.decision.value} by "
            f"{describe_principal(existing.approver_principal_id)})"
            if existing is not None
            else "an unreadable decision"
        )
        raise ApprovalRefused(
            f"{what} is already recorded for {action.id}; a denial is final and a live "
            "approval cannot be replaced"
        )
    if status is DecisionWrite.STALE:
        raise ApprovalRefused(f"the decision for {action.id} changed meanwhile; run again")
    raise ApprovalRefused("the decision would already have expired")


def _check_signature(
    stored: StoredDecision, authority: ApprovalAuthority, tenant_id: str | None
) -> None:
    """The record counts only if the key its approver's membership names signed its bytes;
    anything written to Redis some other way is a conflict, whatever it claims."""
    approver = stored.record.approver_principal_id
    who = describe_principal(approver)
    membership = authority.member(approver, tenant_id)
    if membership is None:
        raise _conflict(f"{who} holds no approval membership for this tenant")
    if not stored.signature:
        raise _conflict(f"the decision carries no signature of {who}")
    if stored.signer and stored.signer != membership.public_key:
        raise _conflict(f"the decision is signed by {stored.signer}, not by the key of {who}")
    try:
        verify_detached(stored.raw, stored.signature, membership.public_key)
    except ValueError as exc:
        raise _conflict(f"the signature over the decision is invalid for {who}: {exc}") from None


def _conflict(why: str) -> ConnectorError:
    return ConnectorError(ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT, f"approval: {why}")


def _unavailable(why: str) -> ConnectorError:
    return ConnectorError(ErrorCode.HOST_APPROVAL_AUTHORIZATION_UNAVAILABLE, f"approval: {why}")


async def check_approval(
    records: ApprovalRecords,
    authority: ApprovalAuthority | None,
    action: Action,
    *,
    tenant_id: str | None,
    clock: Clock,
    recorded: RecordRead | None = None,
) -> ApprovalRecord:
    """The terminal approved record that lets this exact Action run; raises ConnectorError.

    `tenant_id` is the verified tenant (from the identity directory), not the claimed one.
    `recorded` is the admission's earlier read of the record (None: read it now).
    """
    if authority is None:
        raise _unavailable(
            "no approval authority directory is configured (AIPD_APPROVAL_AUTHORITY_FILE); "
            "approval-governed capabilities cannot run"
        )
    if recorded is None:
        stored, read_at = await records.read_at(action.id)
        if isinstance(clock, RedisClock):
            # The record's own read carried Redis TIME: the admission's clock needs no TIME.
            clock.offer(read_at)
    elif recorded.error is not None:
        raise recorded.error
    else:
        stored = recorded.stored
    if stored is None:
        raise _unavailable(f"no decision is recorded for {action.id}")
    _check_signature(stored, authority, tenant_id)
    record = stored.record
    if action.approval is not None and action.approval.decision_id != record.decision_id:
        raise _conflict("the Action's decision_id is not the recorded decision")
    if record.action_id != action.id:
        raise _conflict("the recorded decision is for another Action")
    if record.capability != action.capability:
        raise _conflict("the recorded decision is for another capability")
    if record.input_fingerprint != approval_fingerprint(action):
        raise _conflict(
            "the input changed after the decision, or the decision was for another "
            "principal or credential revision"
        )
    if record.tenant_id != tenant_id:
        raise _conflict("the recorded decision is for another tenant")
    if record.decision is not ApprovalDecision.APPROVED:
        raise _conflict(f"{record.decision_id} denied this Action")
    if record.approver_principal_id == action.identity.principal_id:
        raise _conflict("the approver is the Action's own principal")
    now = await clock.now_ms()
    if now >= record.expires_at_unix_ms:
        raise _unavailable(f"{record.decision_id} has expired; a new decision is needed")
    try:
        authority.authorize(
            principal_id=record.approver_principal_id,
            tenant_id=tenant_id,
            capability=action.capability,
            now_ms=now,
            revision=record.approver_revision,
        )
    except NotAuthorized as exc:
        raise _conflict(f"the approver is no longer authorized: {exc}") from None
    return record
