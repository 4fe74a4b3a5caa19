"""The approval ledger: recording a decision, and the check an approved run must pass.

Only the records at `approvals_key(action_id)` authorize an approval-governed capability;
the AIP `ApprovalDecision` an Action carries (`Action.approval`), anything in `input` or a
legacy `_aip` field are claims, and claims grant nothing: a carried decision must be exactly
what a live record says (`decision_view`), or the Action is refused.

Quorum: the authority file may require N distinct members for a capability prefix
(`ApprovalAuthority.quorum_for`); `check_approval` is the one place that counts them. An
Action runs only when N distinct approvers hold live, signed, matching approvals, and one
valid denial by any member refuses it for good. Refusal codes when the check fails:

- `connector_host.approval_authorization_unavailable`: no authority file is configured, no
  decision is recorded, fewer than N live approvals exist (expired ones do not count), or
  Redis could not be read;
- `connector_host.approval_authorization_conflict`: a record is not signed by the key
  its approver's membership names (a record written to Redis by anyone else: no signature,
  a bad one, or another member's key); it is for another action, capability, input or
  tenant; a member denied the Action; the Action's carried decision is not a recorded live
  approval (or differs from it in any field); or an approver is no longer authorized
  (membership gone, expired, or at another revision).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from schemas.action import Action
from schemas.aip.approval import ApprovalDecision as AipApprovalDecision
from schemas.aip.approval import EvidenceArtifact
from schemas.aip.common import Principal
from schemas.approval import (
    MAX_INPUT_SNAPSHOT_BYTES,
    MAX_REASON_CHARS,
    ApprovalDecision,
    ApprovalRecord,
    PolicyDecision,
)
from schemas.errors import ErrorCode
from schemas.ids import split_capability
from schemas.operator import ApprovalChoice
from worker.aip.did_key import public_key_from_nkey
from worker.aip.envelope import format_timestamp
from worker.errors import ApprovalRefused, ConnectorError, NotAuthorized
from worker.fingerprints import approval_fingerprint, canonical_request
from worker.store.approvals import ApprovalRecords, DecisionWrite, StoredDecision, WriteOutcome
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


def approval_id_of(action_id: str) -> str:
    """The AIP approval id (`appr_…`) of an Action's approval request: one request per
    Action, so every member's decision on it names the same id."""
    return "appr_" + action_id.removeprefix("act_")


def decision_view(record: ApprovalRecord, signer: str) -> AipApprovalDecision:
    """A recorded decision as the AIP `ApprovalDecision` an Action carries: what `approve`
    prints and the only form a carried decision is accepted in. `signer` is the approver's
    public nkey (its `did:key` names the approver). The input fingerprint travels as the
    `input_snapshot` evidence's hash, the authority it was decided under as
    `authority_path`."""
    policy = record.policy_decision
    seconds, millis = divmod(record.created_at_unix_ms, 1000)
    moment = datetime.fromtimestamp(seconds, UTC).replace(microsecond=millis * 1000)
    return AipApprovalDecision(
        approval_id=approval_id_of(record.action_id),
        decision=record.decision.value,
        approver=Principal(
            id=record.approver_principal_id,
            kind="human",
            did=public_key_from_nkey(signer).did,
        ),
        decided_at=format_timestamp(moment),
        reason=record.reason,
        evidence=[
            EvidenceArtifact(
                id=f"input:{record.decision_id}",
                kind="input_snapshot",
                hash=f"sha256:{record.input_fingerprint}",
                redacted=record.input_snapshot_truncated,
            )
        ],
        decision_id=record.decision_id,
        policy_hash=f"sha256:{policy.authority_file_sha256}",
        authority_path=[
            f"membership:{policy.membership_principal_id}#{policy.membership_revision}",
            f"capability_prefix:{policy.matched_capability_prefix}",
        ],
    )


def input_snapshot(action: Action) -> tuple[str, bool]:
    """Canonical JSON of {capability, input} for people, cut on a character boundary."""
    text = canonical_request(action.capability, action.input).decode()
    encoded = text.encode()
    if len(encoded) <= MAX_INPUT_SNAPSHOT_BYTES:
        return text, False
    return encoded[:MAX_INPUT_SNAPSHOT_BYTES].decode("utf-8", errors="ignore"), True


def required_approvals(authority: ApprovalAuthority, action: Action) -> int:
    """N for this Action: its capability's quorum (`ApprovalAuthority.quorum_for`), except
    that an operator resume answering `deny` needs one approval: it only refuses what Hermes
    asked, so one member's denial ends the run (`escalations resolve --choice deny`)."""
    if _answers_deny(action):
        return 1
    return authority.quorum_for(action.capability).required


def _answers_deny(action: Action) -> bool:
    try:
        operation = split_capability(action.capability)[1]
    except ValueError:
        return False
    resume = action.input.get("resume")
    return (
        operation == "operator"
        and isinstance(resume, dict)
        and resume.get("choice") == ApprovalChoice.DENY.value
    )


@dataclass(frozen=True, slots=True)
class RecordRead:
    """One read of an Action's approval record, or the error the read raised: taken early
    (its Redis time serves the whole admission) and judged at the approval step."""

    stored: list[StoredDecision]
    error: ConnectorError | None = None


async def prefetch_record(
    records: ApprovalRecords, action_id: str, clock: RedisClock
) -> RecordRead:
    """Read the records now and give their Redis time to `clock`; a failure is kept, not
    raised."""
    try:
        stored, read_at = await records.read_at(action_id)
    except ConnectorError as exc:
        return RecordRead([], exc)
    clock.offer(read_at)
    return RecordRead(stored)


@dataclass(frozen=True, slots=True)
class Recorded:
    """One member's decision as `record_decision` stored it, and where the quorum stands."""

    record: ApprovalRecord
    #: Live approvals by distinct members after the write (a denial ends it at any count).
    approvals: int
    #: N: the approvals the capability's quorum requires.
    required: int
    #: The decision as an Action carries it (`decision_view`).
    view: AipApprovalDecision


@dataclass(frozen=True, slots=True)
class ApprovedQuorum:
    """The live approvals that let an Action run: distinct approvers, at least `required`;
    `primary` is the one the Action carried (else the oldest)."""

    records: tuple[ApprovalRecord, ...]
    required: int

    @property
    def primary(self) -> ApprovalRecord:
        return self.records[0]


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
    """`record_decision`'s record, for a caller that needs no quorum count."""
    recorded = await record_decision(
        redis, authority, action, as_principal, reason, decision, seed=seed, ttl_ms=ttl_ms
    )
    return recorded.record


async def record_decision(
    redis: Any,
    authority: ApprovalAuthority,
    action: Action,
    as_principal: str,
    reason: str,
    decision: ApprovalDecision,
    *,
    seed: bytes,
    ttl_ms: int = DEFAULT_APPROVAL_TTL_MS,
) -> Recorded:
    """Record `as_principal`'s decision on exactly this Action request, signed with `seed`,
    and say how many of the N approvals its capability's quorum requires now exist.

    The approver must hold a live membership for the Action's tenant whose capability
    prefixes cover its capability and whose `public_key` is `seed`'s, and may not decide on
    an Action of its own principal (the point of approval is a second party). Raises
    ApprovalRefused otherwise; when a member denied the Action (final); when this member
    already holds a live approval (the same member counts once); or when the quorum is
    already met (a decision that authorized a run is never contradicted).
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
    required = required_approvals(authority, action)
    outcome = await records.write(
        record,
        signed,
        sign_detached(signed, seed),
        signer,
        read_revision=read_revision,
        required=required,
    )
    status = outcome.status
    if status in (DecisionWrite.WRITTEN, DecisionWrite.EXISTS):
        return Recorded(record, outcome.live, required, decision_view(record, signer))
    if status is DecisionWrite.CONFLICT:
        raise ApprovalRefused(_conflict_reason(outcome, action, as_principal, required))
    if status is DecisionWrite.STALE:
        raise ApprovalRefused(f"the decision for {action.id} changed meanwhile; run again")
    raise ApprovalRefused("the decision would already have expired")


def _conflict_reason(
    outcome: WriteOutcome, action: Action, as_principal: str, required: int
) -> str:
    """Why `approval_write.lua` refused a decision, for the approver."""
    existing = outcome.stored
    if existing is None:
        return f"an unreadable decision is already recorded for {action.id}"
    what = (
        f"{existing.decision_id} ({existing.decision.value} by "
        f"{describe_principal(existing.approver_principal_id)})"
    )
    if existing.decision is ApprovalDecision.DENIED:
        return f"{what} is recorded for {action.id}: a denial is final"
    if existing.approver_principal_id == as_principal and outcome.live < required:
        return (
            f"{what} is your live approval of {action.id}: the same member counts once "
            f"({outcome.live} of {required} approvals)"
        )
    return (
        f"{action.id} already holds {outcome.live} of {required} approvals (the last: {what}); "
        "a decision that authorized a run is never replaced or contradicted"
    )


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


def _check_binding(record: ApprovalRecord, action: Action, tenant_id: str | None) -> None:
    """A record binds one exact request: this Action, capability, input and principal, in
    the verified tenant, decided by someone other than the Action's principal."""
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
    if record.approver_principal_id == action.identity.principal_id:
        raise _conflict("the approver is the Action's own principal")


def _check_carried(
    carried: AipApprovalDecision, live: list[StoredDecision]
) -> StoredDecision:
    """The live approval an Action's carried `ApprovalDecision` names (by `decision_id`,
    else by approver), which it must equal field for field: the record is the authority, so
    a carried decision that says anything else is refused, never believed."""
    if carried.decision_id is not None:
        found = [d for d in live if d.record.decision_id == carried.decision_id]
    else:
        found = [d for d in live if d.record.approver_principal_id == carried.approver.id]
    if not found:
        raise _conflict(
            "the Action's approval names no live recorded decision (a carried decision is "
            "never authority)"
        )
    stored = found[0]
    expected: dict[str, Any] = msgspec.to_builtins(decision_view(stored.record, stored.signer))
    for name, value in msgspec.to_builtins(carried).items():
        if expected.get(name) != value:
            raise _conflict(f"the Action's approval.{name} is not the recorded decision's")
    return stored


async def check_approval(
    records: ApprovalRecords,
    authority: ApprovalAuthority | None,
    action: Action,
    *,
    tenant_id: str | None,
    clock: Clock,
    recorded: RecordRead | None = None,
) -> ApprovedQuorum:
    """The live approvals (N distinct members, N from the authority file's quorum for the
    capability) that let this exact Action run; raises ConnectorError. The one place a
    quorum is counted.

    `tenant_id` is the verified tenant (from the identity directory), not the claimed one.
    `recorded` is the admission's earlier read of the records (None: read them now).
    """
    if authority is None:
        raise _unavailable(
            "no approval authority directory is configured (AIPD_APPROVAL_AUTHORITY_FILE); "
            "approval-governed capabilities cannot run"
        )
    if recorded is None:
        stored, read_at = await records.read_at(action.id)
        if isinstance(clock, RedisClock):
            # The records' own read carried Redis TIME: the admission's clock needs no TIME.
            clock.offer(read_at)
    elif recorded.error is not None:
        raise recorded.error
    else:
        stored = recorded.stored
    if not stored:
        if action.approval is not None:
            raise _conflict(
                f"the Action carries an ApprovalDecision but no decision is recorded for "
                f"{action.id} (a carried decision is never authority)"
            )
        raise _unavailable(f"no decision is recorded for {action.id}")
    for decision in stored:
        _check_signature(decision, authority, tenant_id)
        _check_binding(decision.record, action, tenant_id)
    for decision in stored:
        record = decision.record
        if record.decision is not ApprovalDecision.APPROVED:
            raise _conflict(
                f"{record.decision_id} by {describe_principal(record.approver_principal_id)} "
                "denied this Action"
            )
    now = await clock.now_ms()
    live: list[StoredDecision] = []
    for decision in stored:
        record = decision.record
        if now >= record.expires_at_unix_ms or any(
            d.record.approver_principal_id == record.approver_principal_id for d in live
        ):
            continue
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
        live.append(decision)
    required = required_approvals(authority, action)
    if not live:
        raise _unavailable(
            f"{stored[-1].record.decision_id} has expired; a new decision is needed"
        )
    if len(live) < required:
        raise _unavailable(
            f"{len(live)} of {required} approvals by distinct members are recorded for "
            f"{action.id}; the quorum is not met"
        )
    if action.approval is not None:
        primary = _check_carried(action.approval, live)
        live = [primary, *(d for d in live if d is not primary)]
    return ApprovedQuorum(tuple(d.record for d in live), required)
