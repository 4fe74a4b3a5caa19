"""Who may cancel an Action: its own principal, or one the authority file lets cancel it.

A Cancel Envelope is signed by the gateway like an Action, as its requester, but its
requester (`from.id`, `requested_by` here) is a claim like any other field. It is honoured
only when

1. `requested_by` is a live principal of the trusted identity directory
   (`connector_host.authentication` otherwise, as for an Action's unknown principal); and
2. it is the principal of the Action it names, or it holds an approval-authority
   membership for that Action's tenant whose `cancel_capability_prefixes` cover the
   Action's capability (`connector_host.approval_authorization_conflict` otherwise).

The second code is the spec's nearest: the requester claims an authority over the Action
that the authority directory and the durable Action record (its recorded principal)
contradict; it is a policy refusal, never retried. `operator_policy` was not chosen because
the check covers every capability, not only the operator.
"""

from __future__ import annotations

from schemas.errors import ErrorCode
from worker.errors import ConnectorError, NotAuthorized
from worker.store.clock import Clock
from worker.store.lease_store import ActionSubject
from worker.trust.authority import ApprovalAuthority
from worker.trust.files import describe_principal
from worker.trust.identities import IdentityDirectory, TrustedIdentity


class CancelAuthority:
    """The cancel check, over the directories the trust gate loaded at startup."""

    def __init__(
        self, identities: IdentityDirectory | None, authority: ApprovalAuthority | None
    ) -> None:
        self.identities = identities
        self.authority = authority

    async def requester(self, requested_by: str, clock: Clock) -> TrustedIdentity:
        """The directory's entry for `requested_by`; raises ConnectorError when it has none."""
        who = describe_principal(requested_by)
        entry = self.identities.get(requested_by) if self.identities is not None else None
        if entry is None:
            raise ConnectorError(
                ErrorCode.HOST_AUTHENTICATION,
                f"cancel: requester {who} is not in the trusted identity directory",
            )
        expires = entry.expires_at_unix_ms
        if expires is not None and await clock.now_ms() >= expires:
            raise ConnectorError(
                ErrorCode.HOST_AUTHENTICATION,
                f"cancel: requester {who}'s directory entry has expired",
            )
        return entry

    async def check(
        self, requester: TrustedIdentity, subject: ActionSubject, clock: Clock
    ) -> None:
        """Raise ConnectorError unless `requester` may cancel the Action of `subject`."""
        if requester.principal_id == subject.principal_id:
            return
        who = describe_principal(requester.principal_id)
        if self.authority is None:
            raise ConnectorError(
                ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT,
                f"cancel: {who} is not the Action's principal and no approval authority file "
                "grants cancel rights (AIPD_APPROVAL_AUTHORITY_FILE)",
            )
        try:
            self.authority.authorize_cancel(
                principal_id=requester.principal_id,
                tenant_id=subject.tenant_id,
                capability=subject.capability,
                now_ms=await clock.now_ms(),
            )
        except NotAuthorized as exc:
            raise ConnectorError(
                ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT,
                f"cancel: not the Action's principal, and {exc}",
            ) from None
