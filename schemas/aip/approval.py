"""Approvals in AIP 1.0's shape: the request, the decision (also carried by an Action), the
policy a capability contract names, and the record view (shared/reference/aip-1.0-wire.md
§1.11; upstream `approval_*.schema.json`)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from schemas.aip._base import AipStruct, UInt
from schemas.aip.common import IdentityContext, Principal, Risk, Timestamp

Decision = Literal["approved", "denied", "expired", "revoked"]
EvidenceRequirement = Literal[
    "reason", "input_snapshot", "policy_decision", "external_ticket", "attachment"
]


class EvidenceArtifact(AipStruct, frozen=True):
    """Evidence attached to an approval."""

    id: Annotated[str, Meta(description="Artifact id.")]
    kind: Annotated[str, Meta(description="What kind of evidence it is.")]
    redacted: Annotated[bool, Meta(description="Whether the artifact was redacted.")]
    uri: Annotated[str | None, Meta(description="Where it is kept.")] = None
    hash: Annotated[str | None, Meta(description="Its content hash.")] = None


class ApprovalConstraint(AipStruct, frozen=True):
    """A condition the approved Action must meet."""

    field: Annotated[str, Meta(description="The constrained field.")]
    operator: Annotated[str, Meta(description="Comparison, e.g. `lte`, `eq`, `matches`.")]
    value: Annotated[Any, Meta(description="The value compared with.")]


class _Selector(AipStruct, tag_field="type", frozen=True):
    pass


class PrincipalSelector(_Selector, tag="principal", frozen=True):
    """One named principal approves."""

    id: Annotated[str, Meta(description="The approver's principal id.")]


class RoleSelector(_Selector, tag="role", frozen=True):
    """Members of a role approve."""

    name: Annotated[str, Meta(description="The role.")]


class GroupSelector(_Selector, tag="group", frozen=True):
    """Members of a group approve."""

    name: Annotated[str, Meta(description="The group.")]


class TenantPolicySelector(_Selector, tag="tenant_policy", frozen=True):
    """The tenant's policy decides who approves."""


class ExternalSystemSelector(_Selector, tag="external_system", frozen=True):
    """An external system approves."""

    system: Annotated[str, Meta(description="The external system.")]


ApproverSelector = (
    PrincipalSelector | RoleSelector | GroupSelector | TenantPolicySelector | ExternalSystemSelector
)


class ApprovalDecision(AipStruct, frozen=True):
    """An approver's decision on one approval request (also `Action.approval`, where it
    must be `approved`; the durable signed record stays the authority)."""

    approval_id: Annotated[str, Meta(description="The approval request decided (`appr_…`).")]
    decision: Annotated[Decision, Meta(description="The decision.")]
    approver: Annotated[Principal, Meta(description="Who decided.")]
    decided_at: Annotated[Timestamp, Meta(description="When (RFC 3339).")]
    reason: Annotated[str | None, Meta(description="Why.")] = None
    constraints: Annotated[
        list[ApprovalConstraint], Meta(description="Conditions the Action must meet.")
    ] = msgspec.field(default_factory=list)
    evidence: Annotated[list[EvidenceArtifact], Meta(description="Evidence for the decision.")] = (
        msgspec.field(default_factory=list)
    )
    decision_id: Annotated[
        str | None, Meta(description="Stable decision id, for idempotent replay.")
    ] = None
    policy_hash: Annotated[
        str | None, Meta(description="Hash of the policy decided under; must match the request's.")
    ] = None
    authority_path: Annotated[
        list[str], Meta(description="The resolver's authority path to the approver.")
    ] = msgspec.field(default_factory=list)
    target_decision_id: Annotated[
        str | None, Meta(description="For `revoked`: the decision revoked.")
    ] = None


class _Rule(AipStruct, tag_field="operator", frozen=True):
    pass


class AllRule(_Rule, tag="all", frozen=True):
    """Every nested rule must be met."""

    __aip_defaults__: ClassVar[dict[str, Any]] = {"allow_decision_reuse": False}

    rules: Annotated[list[ApprovalRule], Meta(description="The nested rules.")]
    allow_decision_reuse: Annotated[
        bool | msgspec.UnsetType,
        Meta(description="Whether one decision may satisfy several nested rules."),
    ] = msgspec.UNSET


class AnyRule(_Rule, tag="any", frozen=True):
    """One nested rule suffices."""

    rules: Annotated[list[ApprovalRule], Meta(description="The nested rules.")]


class QuorumRule(_Rule, tag="quorum", frozen=True):
    """`required` of the nested rules must be met."""

    __aip_defaults__: ClassVar[dict[str, Any]] = {"distinct_principals": True}

    required: Annotated[UInt, Meta(description="How many must be met.")]
    rules: Annotated[list[ApprovalRule], Meta(description="The nested rules.")]
    distinct_principals: Annotated[
        bool | msgspec.UnsetType,
        Meta(description="Whether each must be met by a different principal (default true)."),
    ] = msgspec.UNSET


class PrincipalRule(_Rule, tag="principal", frozen=True):
    """A named principal approves."""

    id: Annotated[str, Meta(description="The principal id.")]


class RoleRule(_Rule, tag="role", frozen=True):
    """A member of a role approves."""

    name: Annotated[str, Meta(description="The role.")]


class GroupRule(_Rule, tag="group", frozen=True):
    """A member of a group approves."""

    name: Annotated[str, Meta(description="The group.")]


class TenantPolicyRule(_Rule, tag="tenant_policy", frozen=True):
    """A tenant policy decides."""

    policy_id: Annotated[str, Meta(description="The tenant policy.")]


class ExternalSystemRule(_Rule, tag="external_system", frozen=True):
    """An external system decides."""

    system: Annotated[str, Meta(description="The external system.")]


class DelegatedAuthorityRule(_Rule, tag="delegated_authority", frozen=True):
    """Delegated authority within limits suffices."""

    scope: Annotated[str, Meta(description="The delegated scope required.")]
    max_risk: Annotated[Risk | None, Meta(description="Highest risk it covers.")] = None
    max_value: Annotated[UInt | None, Meta(description="Highest governed value it covers.")] = None


ApprovalRule = (
    AllRule
    | AnyRule
    | QuorumRule
    | PrincipalRule
    | RoleRule
    | GroupRule
    | TenantPolicyRule
    | ExternalSystemRule
    | DelegatedAuthorityRule
)


class PolicyDelegatedAuthority(AipStruct, frozen=True):
    """Authority an approval policy accepts in place of an approver."""

    principal: Annotated[str, Meta(description="The principal given approval authority.")]
    scope: Annotated[list[str], Meta(description="Scopes.")] = msgspec.field(default_factory=list)
    expires_at: Annotated[str | None, Meta(description="RFC 3339 expiry.")] = None


class SeparationOfDuties(AipStruct, frozen=True):
    """Who may not approve their own work."""

    __aip_defaults__: ClassVar[dict[str, Any]] = {
        "requester_must_differ": False,
        "operator_must_differ": False,
        "allow_self_approval": False,
    }

    requester_must_differ: Annotated[
        bool | msgspec.UnsetType, Meta(description="The approver may not be the requester.")
    ] = msgspec.UNSET
    operator_must_differ: Annotated[
        bool | msgspec.UnsetType, Meta(description="The approver may not be the operator.")
    ] = msgspec.UNSET
    allow_self_approval: Annotated[
        bool | msgspec.UnsetType, Meta(description="Whether self-approval is allowed.")
    ] = msgspec.UNSET


class ApprovalPolicy(AipStruct, frozen=True):
    """When a capability needs approval, and from whom (`CapabilityContract.approval`)."""

    __aip_defaults__: ClassVar[dict[str, Any]] = {
        "minimum_distinct_principals": 1,
        "separation_of_duties": SeparationOfDuties(),
    }

    required: Annotated[bool, Meta(description="Whether approval is required.")]
    approver_selector: Annotated[ApproverSelector, Meta(description="Who approves.")]
    reason: Annotated[str | None, Meta(description="Why approval is needed.")] = None
    ttl_ms: Annotated[UInt | None, Meta(description="How long a decision is valid.")] = None
    evidence_requirements: Annotated[
        list[EvidenceRequirement], Meta(description="Evidence a request must carry.")
    ] = msgspec.field(default_factory=list)
    delegated_authority: Annotated[
        PolicyDelegatedAuthority | None, Meta(description="Delegated authority accepted.")
    ] = None
    rule: Annotated[ApprovalRule | None, Meta(description="The approval rule.")] = None
    minimum_distinct_principals: Annotated[
        UInt | msgspec.UnsetType,
        Meta(description="Distinct approvers needed (default 1)."),
    ] = msgspec.UNSET
    separation_of_duties: Annotated[
        SeparationOfDuties | msgspec.UnsetType,
        Meta(description="Separation-of-duties rules (default: all false)."),
    ] = msgspec.UNSET
    policy_version: Annotated[str | None, Meta(description="The policy's version.")] = None


class ApprovalRequest(AipStruct, frozen=True):
    """A durable request for approval of one Action."""

    id: Annotated[str, Meta(description="Approval id (`appr_…`).")]
    action_id: Annotated[str, Meta(description="The Action awaiting approval.")]
    capability_id: Annotated[str, Meta(description="Its capability.")]
    requester: Annotated[Principal, Meta(description="Who asks.")]
    subject: Annotated[Principal, Meta(description="Whom the approval is about.")]
    approver_selector: Annotated[ApproverSelector, Meta(description="Who may approve.")]
    reason: Annotated[str, Meta(min_length=1, description="Why approval is needed.")]
    evidence: Annotated[list[EvidenceArtifact], Meta(description="Evidence for the approver.")] = (
        msgspec.field(default_factory=list)
    )
    expires_at: Annotated[str | None, Meta(description="RFC 3339 expiry.")] = None
    policy_decision_id: Annotated[str | None, Meta(description="The policy decision.")] = None
    identity: Annotated[IdentityContext | None, Meta(description="The Action's identity.")] = None
    policy_snapshot: Annotated[ApprovalPolicy | None, Meta(description="The policy evaluated.")] = (
        None
    )
    policy_hash: Annotated[str | None, Meta(description="Hash of that policy.")] = None
    operator: Annotated[Principal | None, Meta(description="The operator.")] = None
    risk: Annotated[Risk | None, Meta(description="The Action's risk.")] = None
    governed_value: Annotated[Any, Meta(description="The value governed.")] = None


class EvidencePayload(AipStruct, frozen=True):
    """The sensitive evidence behind an approval record (export only)."""

    action_id: Annotated[str | None, Meta(description="The Action.")] = None
    capability_id: Annotated[str | None, Meta(description="Its capability.")] = None
    input_hash: Annotated[str | None, Meta(description="Hash of its input.")] = None
    input: Annotated[Any, Meta(description="Its input.")] = None
    transaction: Annotated[Any, Meta(description="Its transaction.")] = None
    identity: Annotated[Any, Meta(description="Its identity.")] = None
