"""The approval authority directory: who may approve which capabilities for which tenant.

Loaded from `--approval-authority-file` (`AIPD_APPROVAL_AUTHORITY_FILE`): a JSON array of
`AuthorityMembership` records, or an object `{"memberships": [...], "quorums": [...]}` whose
`ApprovalQuorum` entries require N distinct approvers for a capability prefix (the longest
matching prefix wins; none: one approval; a quorum no N members could ever meet stops
startup). Each membership names the approver's public nkey (its decisions must carry that
key's signature; two principals may not share a key). The file is a regular file under
1 MiB that group and others cannot write. It is authorization policy, not a credential
store, so it may be world-readable.
Duplicate (same principal and tenant), revoked and zero-revision memberships stop the
worker at startup; one that has already expired is skipped with a warning and counted
(`trust_entries_expired`), before the duplicate and shared-key checks, so a renewed
membership may sit next to its expired predecessor (`worker.trust.files.has_expired`).
The same check runs when a decision is made and again when the approved Action executes,
so a membership removed in between withdraws the approval.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from schemas.approval import ApprovalQuorum, AuthorityMembership, AuthorityPolicy
from worker.errors import NotAuthorized, TrustConfigError
from worker.trust.files import (
    PolicyFile,
    describe_principal,
    has_expired,
    read_policy_file,
    typed_records,
)
from worker.trust.signing import decode_user_public_key

_WHAT = "approval authority file"

log = logging.getLogger(__name__)
UNRESTRICTED = "*"


@dataclass(frozen=True, slots=True)
class MembershipMatch:
    membership: AuthorityMembership
    matched_prefix: str


#: The quorum of a capability no `quorums` entry names: today's single approval.
SINGLE = ApprovalQuorum(capability_prefix=UNRESTRICTED, required=1)


def parse_policy(policy: PolicyFile, path: Path) -> tuple[Any, list[ApprovalQuorum]]:
    """The raw membership array and the quorums of an authority file (either form)."""
    try:
        raw: Any = msgspec.json.decode(policy.data)
    except msgspec.DecodeError as exc:
        raise TrustConfigError(f"{_WHAT} {path}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        return raw, []
    try:
        parsed = msgspec.convert(raw, AuthorityPolicy, strict=True)
    except msgspec.ValidationError as exc:
        raise TrustConfigError(f"{_WHAT} {path}: {exc}") from None
    seen: set[str] = set()
    for index, quorum in enumerate(parsed.quorums):
        if quorum.capability_prefix in seen:
            raise TrustConfigError(
                f"{_WHAT} {path}: quorum {index}: duplicate capability_prefix "
                f"{quorum.capability_prefix!r}"
            )
        seen.add(quorum.capability_prefix)
    return parsed.memberships, list(parsed.quorums)


def _overlaps(membership_prefix: str, capability_prefix: str) -> bool:
    """Whether a membership with this prefix may decide on some capability of the quorum's."""
    return (
        UNRESTRICTED in (membership_prefix, capability_prefix)
        or capability_prefix.startswith(membership_prefix)
        or membership_prefix.startswith(capability_prefix)
    )


class ApprovalAuthority:
    """Memberships by (principal, tenant), plus the file's digest for decision evidence."""

    def __init__(
        self,
        memberships: dict[tuple[str, str | None], AuthorityMembership],
        sha256: str,
        *,
        expired: int = 0,
        quorums: list[ApprovalQuorum] | None = None,
    ) -> None:
        self._memberships = memberships
        self.sha256 = sha256
        # Longest prefix first, so the first match is the most specific.
        self.quorums = sorted(quorums or [], key=lambda q: -len(q.capability_prefix))
        #: Memberships the file holds that had already expired at load, and were skipped.
        self.expired = expired

    def __len__(self) -> int:
        return len(self._memberships)

    @classmethod
    def load(cls, path: Path, *, now_ms: int) -> ApprovalAuthority:
        policy = read_policy_file(path, what=_WHAT)
        raw, quorums = parse_policy(policy, path)
        found: dict[tuple[str, str | None], AuthorityMembership] = {}
        index_of: dict[tuple[str, str | None], int] = {}
        principal_of_key: dict[str, str] = {}
        expired = 0
        for index, where, membership in typed_records(
            raw, path, what=_WHAT, noun="membership", record_type=AuthorityMembership
        ):
            key = (membership.principal_id, membership.tenant_id)
            problem = _membership_problem(membership)
            if problem is None and has_expired(membership.expires_at_unix_ms, now_ms):
                expired += 1
                log.warning("%s: has expired; skipped (remove or renew the membership)", where)
                continue
            if problem is None and key in index_of:
                problem = f"duplicate of membership {index_of[key]} (same principal and tenant)"
            holder = principal_of_key.setdefault(membership.public_key, membership.principal_id)
            if problem is None and holder != membership.principal_id:
                problem = (
                    f"public_key is also the key of {describe_principal(holder)}: each "
                    "approver signs with its own key"
                )
            if problem is not None:
                raise TrustConfigError(f"{where}: {problem}")
            index_of[key] = index
            found[key] = membership
        for index, quorum in enumerate(quorums):
            # Decisions are per tenant: N members of one tenant must be able to meet it.
            per_tenant: dict[str | None, set[str]] = {}
            for m in found.values():
                if any(_overlaps(p, quorum.capability_prefix) for p in m.capability_prefixes):
                    per_tenant.setdefault(m.tenant_id, set()).add(m.principal_id)
            most = max((len(members) for members in per_tenant.values()), default=0)
            if most < quorum.required:
                raise TrustConfigError(
                    f"{_WHAT} {path}: quorum {index} ({quorum.capability_prefix!r}) requires "
                    f"{quorum.required} distinct approvers but only {most} member(s) of any "
                    "one tenant may approve it: it could never be met"
                )
        return cls(found, policy.sha256, expired=expired, quorums=quorums)

    def quorum_for(self, capability: str) -> ApprovalQuorum:
        """The quorum that governs `capability`: the longest matching prefix's, else one."""
        for quorum in self.quorums:
            prefix = quorum.capability_prefix
            if prefix == UNRESTRICTED or capability.startswith(prefix):
                return quorum
        return SINGLE

    def member(self, principal_id: str, tenant_id: str | None) -> AuthorityMembership | None:
        """The membership of `principal_id` for `tenant_id`, whatever it may decide."""
        return self._memberships.get((principal_id, tenant_id))

    def authorize(
        self,
        *,
        principal_id: str,
        tenant_id: str | None,
        capability: str,
        now_ms: int,
        revision: int | None = None,
    ) -> MembershipMatch:
        """The membership that lets `principal_id` decide on `capability` for `tenant_id`.

        With `revision`, the membership must still be at that revision (the check made when
        an approved Action runs). Raises NotAuthorized with a reason fit for an operator.
        """
        membership = self._memberships.get((principal_id, tenant_id))
        who = describe_principal(principal_id)
        if membership is None:
            raise NotAuthorized(f"{who} holds no approval membership for this tenant")
        if revision is not None and membership.revision != revision:
            raise NotAuthorized(
                f"{who} decided at membership revision {revision}; it is now {membership.revision}"
            )
        if membership.expires_at_unix_ms is not None and now_ms >= membership.expires_at_unix_ms:
            raise NotAuthorized(f"{who}'s approval membership has expired")
        for prefix in membership.capability_prefixes:
            if prefix == UNRESTRICTED or capability.startswith(prefix):
                return MembershipMatch(membership, prefix)
        raise NotAuthorized(f"{who} may not approve capability {capability!r}")


    def deciders(
        self, *, tenant_id: str | None, capability: str, now_ms: int
    ) -> list[AuthorityMembership]:
        """Every current membership that may decide on `capability` for `tenant_id` (whom
        a prompt's command is sealed to: `worker.operator.sealed_command`)."""
        found = []
        for (principal_id, tenant), membership in self._memberships.items():
            if tenant != tenant_id:
                continue
            try:
                self.authorize(
                    principal_id=principal_id, tenant_id=tenant, capability=capability,
                    now_ms=now_ms,
                )
            except NotAuthorized:
                continue
            found.append(membership)
        return found

    def authorize_cancel(
        self, *, principal_id: str, tenant_id: str | None, capability: str, now_ms: int
    ) -> MembershipMatch:
        """The membership that lets `principal_id` cancel another principal's Action on
        `capability` in `tenant_id` (its `cancel_capability_prefixes`); raises NotAuthorized."""
        membership = self._memberships.get((principal_id, tenant_id))
        who = describe_principal(principal_id)
        if membership is None:
            raise NotAuthorized(f"{who} holds no authority membership for this tenant")
        if membership.expires_at_unix_ms is not None and now_ms >= membership.expires_at_unix_ms:
            raise NotAuthorized(f"{who}'s authority membership has expired")
        for prefix in membership.cancel_capability_prefixes:
            if prefix == UNRESTRICTED or capability.startswith(prefix):
                return MembershipMatch(membership, prefix)
        raise NotAuthorized(f"{who} may not cancel capability {capability!r}")


def _membership_problem(membership: AuthorityMembership) -> str | None:
    """What makes a membership malformed (it stops startup); expiry is not among them."""
    if membership.revision == 0:
        return "revision must be non-zero"
    try:
        decode_user_public_key(membership.public_key)
    except ValueError as exc:
        return f"public_key is {exc}"
    if membership.revoked:
        return "is revoked; remove the membership"
    return None
