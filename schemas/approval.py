"""Approval decisions and the authority memberships that may make them.

An `ApprovalRecord` is the only thing that lets an approval-governed capability run: it lives
in Redis at `aip:approvals:{act_…}` (one slot per approver), written once per decision by an
approver whose `AuthorityMembership` (from the approval authority file) covers the Action's
tenant and capability, and signed with the key that membership names (the signature is stored
beside the record, over its exact bytes). An `ApprovalQuorum` of the authority file says how
many distinct members must approve a capability. The AIP `ApprovalDecision` an Action carries
is a claim checked against such records, never authority of its own.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import msgspec

from schemas._base import WireStruct
from schemas.ids import ActionId, ShortText, UnixMs

DECISION_ID_PATTERN = r"^apr_[0-9a-f]{32}\Z"
FINGERPRINT_PATTERN = r"^[0-9a-f]{64}\Z"
MAX_REASON_CHARS = 2_048
#: The input snapshot is evidence for people; the fingerprint is what binds the decision.
MAX_INPUT_SNAPSHOT_BYTES = 16_384
MAX_CAPABILITY_PREFIXES = 256
#: A public user nkey: the key an approver signs its decisions with.
PUBLIC_USER_KEY_PATTERN = r"^U[A-Z2-7]{55}$"

DecisionId = Annotated[str, msgspec.Meta(pattern=DECISION_ID_PATTERN)]
Fingerprint = Annotated[str, msgspec.Meta(pattern=FINGERPRINT_PATTERN)]
Revision = Annotated[int, msgspec.Meta(ge=1)]
Reason = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REASON_CHARS)]
InputSnapshot = Annotated[str, msgspec.Meta(max_length=MAX_INPUT_SNAPSHOT_BYTES)]
CapabilityPrefix = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


class ApprovalDecision(StrEnum):
    APPROVED = "approved"
    DENIED = "denied"


class AuthorityMembership(WireStruct, frozen=True, kw_only=True):
    """One approver's standing: which tenant's Actions, and which capabilities, it may decide.

    `revision` is checked at decision time and again when the Action runs, so bumping it in
    the authority file withdraws every decision made under the old revision. A `tenant_id`
    of null covers only Actions without a tenant; the literal prefix `*` covers every
    capability and is an explicit opt-in.
    """

    principal_id: ShortText
    revision: Annotated[int, msgspec.Meta(ge=0)]
    tenant_id: ShortText | None = None
    #: The approver's public user nkey (`U…`): a decision counts only when this key signed
    #: it (`approve --key` holds the seed), so write access to Redis is not approval.
    public_key: Annotated[str, msgspec.Meta(pattern=PUBLIC_USER_KEY_PATTERN)]
    capability_prefixes: Annotated[
        list[CapabilityPrefix], msgspec.Meta(min_length=1, max_length=MAX_CAPABILITY_PREFIXES)
    ]
    #: Capabilities whose Actions this principal may cancel in its tenant although they are
    #: another principal's (an Action's own principal may always cancel it). Empty: none.
    cancel_capability_prefixes: Annotated[
        list[CapabilityPrefix], msgspec.Meta(max_length=MAX_CAPABILITY_PREFIXES)
    ] = msgspec.field(default_factory=list)
    expires_at_unix_ms: UnixMs | None = None
    revoked: bool = False


#: The most approvers a quorum may require (bounds the per-Action record set).
MAX_QUORUM = 16


class ApprovalQuorum(WireStruct, frozen=True, kw_only=True):
    """How many distinct authority members must approve Actions of a capability prefix.

    The longest matching prefix decides; a capability no quorum names needs one approval.
    One valid denial by any member ends the Action, whatever the quorum.
    """

    #: A capability id prefix (`*`: every capability).
    capability_prefix: CapabilityPrefix
    #: N: distinct members (by principal) whose live, signed approvals are required.
    required: Annotated[int, msgspec.Meta(ge=1, le=MAX_QUORUM)]


class AuthorityPolicy(WireStruct, frozen=True, kw_only=True):
    """The object form of the approval authority file: the memberships and the quorums
    (the array form holds memberships only, every quorum 1)."""

    memberships: list[dict[str, object]]
    quorums: Annotated[list[ApprovalQuorum], msgspec.Meta(max_length=MAX_CAPABILITY_PREFIXES)] = (
        msgspec.field(default_factory=list)
    )


class PolicyDecision(WireStruct, frozen=True, kw_only=True):
    """Why the approver was allowed to decide: the evidence the approval policy requires."""

    #: sha256 hex of the authority file the membership was read from.
    authority_file_sha256: Fingerprint
    membership_principal_id: ShortText
    membership_revision: Revision
    membership_tenant_id: ShortText | None = None
    #: The capability prefix of the membership that covers the Action's capability.
    matched_capability_prefix: CapabilityPrefix
    ttl_ms: Annotated[int, msgspec.Meta(ge=1)]
    evaluated_at_unix_ms: UnixMs


class ApprovalRecord(WireStruct, frozen=True, kw_only=True):
    """A durable, write-once approval decision for exactly one Action request."""

    decision_id: DecisionId
    action_id: ActionId
    capability: ShortText
    #: `fingerprint_request`: sha256 of canonical JSON of {capability, input}.
    input_fingerprint: Fingerprint
    decision: ApprovalDecision
    approver_principal_id: ShortText
    approver_revision: Revision
    #: The tenant the Action claimed when it was decided; must equal its verified tenant.
    tenant_id: ShortText | None = None
    reason: Reason
    #: Canonical JSON of {capability, input}, cut at MAX_INPUT_SNAPSHOT_BYTES on a character
    #: boundary.
    input_snapshot: InputSnapshot
    input_snapshot_truncated: bool = False
    policy_decision: PolicyDecision
    created_at_unix_ms: UnixMs
    expires_at_unix_ms: UnixMs
    #: 1 for the first decision on this Action; a later one replaces only an expired approval.
    revision: Revision
