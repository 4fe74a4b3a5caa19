"""The trust gate: everything an Action must pass before any provider request.

Checks run in this order and stop at the first refusal (each raises `ConnectorError`):

1. envelope signature (`connector_host.authentication`): for an Action, its AIP Envelope
   signature by a trusted gateway key (`verify_action_signer`); for the subjects still
   signed by headers, `Aip-Signer`/`Aip-Signature` (`verify_signature`). Unsigned envelopes
   pass only with `AIPD_ALLOW_UNSIGNED_ENVELOPES`, logged as a WARNING on every acceptance;
2. the replay boundary: stored young (against the JetStream stored time) and its state
   still kept (on Redis TIME) (`connector_host.replay`, `worker.trust.replay`);
3. identity directory (`connector_host.authentication`,
   `connector_host.credential_revision_denied`, `connector.hermes_agent.tenant_mismatch`);
   without a directory every Action is refused: governed execution fails closed;
4. route and endpoint tenant binding (`connector_host.route_mismatch`,
   `connector.hermes_agent.tenant_mismatch`): an unbound endpoint admits a tenant's Action
   only when it is configured shared (`worker.trust.tenancy`);
5. for an operator resume, that its principal started the source run or is an authority
   member of the run's tenant (`connector_host.approval_authorization_conflict`,
   `worker.trust.resume_authority`);
6. the durable approval records when the capability requires approval: N distinct
   members' live, signed approvals, N the authority file's quorum for the capability, no
   denial, and a carried AIP `ApprovalDecision` equal to one of them
   (`connector_host.approval_authorization_unavailable|conflict`,
   `worker.trust.approval_ledger.check_approval`, the one place a quorum is counted);
7. the trusted projection's header values (`connector.hermes_agent.configuration_or_input`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from schemas.action import Action
from schemas.approval import ApprovalRecord
from schemas.audit import DetailValue
from schemas.errors import EnvelopeRejected, ErrorCode
from worker.aip.signing import VerifiedEnvelope
from worker.endpoints import Endpoint
from worker.errors import ConnectorError, TrustConfigError
from worker.operations.base import OperationSpec
from worker.settings import Settings
from worker.store.keys import request_id_key
from worker.store.lease_store import ActionSubject
from worker.trust.approval_ledger import check_approval, prefetch_record
from worker.trust.authority import ApprovalAuthority
from worker.trust.cancel_authority import CancelAuthority
from worker.trust.identities import IdentityDirectory, TrustedIdentity
from worker.trust.projection import trusted_projection
from worker.trust.replay import ReplayWindow
from worker.trust.resume_authority import check_resume, resume_source
from worker.trust.signing import (
    SIGNATURE_HEADER,
    SIGNER_HEADER,
    TrustedGatewayKeys,
    verify_envelope,
)
from worker.trust.tenancy import check_endpoint_tenant, check_route
from worker.wire.actions import decode_action

if TYPE_CHECKING:
    from worker.store.stores import Stores

log = logging.getLogger(__name__)

_UNSIGNED_WARNING = (
    "AIPD_ALLOW_UNSIGNED_ENVELOPES is on: envelopes without a gateway signature are "
    "accepted. Anyone who can publish to the actions subject can act as any principal in "
    "the identity directory. Development only."
)


@dataclass(frozen=True, slots=True)
class AdmitDecision:
    """What admitted an Action: the facts its audit receipts record, and its headers."""

    #: The verified gateway key, or None for an unsigned envelope accepted in development.
    signer: str | None
    identity: TrustedIdentity
    #: The approval the Action carried (else the oldest live one) when it needed approval.
    approval: ApprovalRecord | None
    #: The trusted projection for provider requests (see `worker.trust.projection`).
    headers: Mapping[str, str]
    #: Every live approval of the met quorum (`approval` first).
    approvals: tuple[ApprovalRecord, ...] = ()

    @property
    def principal_id(self) -> str:
        return self.identity.principal_id

    @property
    def tenant_id(self) -> str | None:
        return self.identity.tenant_id

    def receipt_details(self) -> dict[str, DetailValue]:
        """Redacted facts for the `admitted` receipt: ids and revisions, never a credential."""
        return {
            "signer": self.signer,
            "principal_id": self.identity.principal_id,
            "credential_revision": self.identity.revision,
            "tenant_id": self.identity.tenant_id,
            "approval_decision_id": self.approval.decision_id if self.approval else None,
            "approver_principal_id": (
                self.approval.approver_principal_id if self.approval else None
            ),
            "approver_principal_ids": ",".join(r.approver_principal_id for r in self.approvals)
            or None,
        }


class TrustGate:
    """Signature, identity, tenant and approval checks, configured once at startup."""

    def __init__(
        self,
        *,
        gateway_keys: TrustedGatewayKeys | None,
        identities: IdentityDirectory | None,
        authority: ApprovalAuthority | None,
        allow_unsigned: bool = False,
        replay: ReplayWindow | None = None,
    ) -> None:
        self.gateway_keys = gateway_keys
        self.replay = replay or ReplayWindow()
        self.identities = identities
        self.authority = authority
        self.allow_unsigned = allow_unsigned
        self.cancels = CancelAuthority(identities, authority)
        #: Entries of each trust file skipped at load because they had expired (the worker
        #: reports them as `trust_entries_expired`; the load logged each one).
        self.expired_entries: Mapping[str, int] = {
            "identity": identities.expired if identities is not None else 0,
            "authority": authority.expired if authority is not None else 0,
        }
        if allow_unsigned:
            log.warning(_UNSIGNED_WARNING)
        elif gateway_keys is None:
            log.error("AIPD_TRUSTED_GATEWAY_KEYS_FILE is not set: every envelope will be refused")
        if identities is None:
            log.error(
                "AIPD_TRUSTED_IDENTITY_FILE is not set: governed execution is refused (fail "
                "closed) until a trusted identity directory is installed"
            )

    @classmethod
    def from_settings(cls, settings: Settings, *, now_ms: int | None = None) -> TrustGate:
        """Load the trust files; a missing, unsafe or malformed one stops startup (an
        expired entry is skipped, see `worker.trust.identities`).

        The error is a TrustConfigError naming the setting, the file and the bad entry.
        `now_ms` (default: this host's clock) decides which entries have already expired.
        """
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        keys = identities = authority = None
        try:
            setting = "AIPD_TRUSTED_GATEWAY_KEYS_FILE"
            if settings.trusted_gateway_keys_file is not None:
                keys = TrustedGatewayKeys.load(settings.trusted_gateway_keys_file)
            setting = "AIPD_TRUSTED_IDENTITY_FILE"
            if settings.trusted_identity_file is not None:
                identities = IdentityDirectory.load(settings.trusted_identity_file, now_ms=now)
            setting = "AIPD_APPROVAL_AUTHORITY_FILE"
            if settings.approval_authority_file is not None:
                authority = ApprovalAuthority.load(settings.approval_authority_file, now_ms=now)
        except TrustConfigError as exc:
            raise TrustConfigError(f"{setting}: {exc}") from None
        return cls(
            gateway_keys=keys,
            identities=identities,
            authority=authority,
            allow_unsigned=settings.allow_unsigned_envelopes,
            replay=ReplayWindow(
                settings.max_envelope_age_ms, settings.max_clock_skew_ms, settings.result_ttl_ms
            ),
        )

    def verify_signature(self, payload: bytes, headers: Mapping[str, str]) -> str | None:
        """The verified signer, or None for an unsigned envelope allowed in development.

        A *present* signature is always verified, also in development: an altered payload
        is never accepted because unsigned ones are.
        """
        if self.allow_unsigned and not _carries_signature(headers):
            log.warning("accepted an UNSIGNED envelope (AIPD_ALLOW_UNSIGNED_ENVELOPES is on)")
            return None
        if self.gateway_keys is None:
            raise ConnectorError(
                ErrorCode.HOST_AUTHENTICATION,
                "no trusted gateway keys are configured (AIPD_TRUSTED_GATEWAY_KEYS_FILE)",
            )
        return verify_envelope(payload, headers, self.gateway_keys)

    def verify_action_signer(self, verified: VerifiedEnvelope | None) -> str | None:
        """The trusted gateway key that signed an Action's AIP Envelope (its name as the
        trust file spells it), or None for an unsigned Envelope allowed in development.

        `verified` is what `worker.wire.envelopes.open_envelope` found: a signature that
        was present has already verified over the Envelope (a bad one never gets here), so
        what is left is whether its `did:key` is a trusted gateway key."""
        if verified is None:
            if self.allow_unsigned:
                log.warning("accepted an UNSIGNED envelope (AIPD_ALLOW_UNSIGNED_ENVELOPES is on)")
                return None
            raise ConnectorError(
                ErrorCode.HOST_AUTHENTICATION,
                "envelope signature: the Envelope is unsigned (no security.signature)",
            )
        if self.gateway_keys is None:
            raise ConnectorError(
                ErrorCode.HOST_AUTHENTICATION,
                "no trusted gateway keys are configured (AIPD_TRUSTED_GATEWAY_KEYS_FILE)",
            )
        signer = self.gateway_keys.signer_of(verified.public_key)
        if signer is None:
            raise ConnectorError(
                ErrorCode.HOST_AUTHENTICATION,
                f"envelope signature: signer {verified.did} is not a trusted gateway key",
            )
        return signer

    async def admit(
        self,
        *,
        payload: bytes,
        endpoint: Endpoint,
        spec: OperationSpec,
        stores: Stores,
    ) -> AdmitDecision:
        """Admit the Action in the AIP Envelope `payload` or raise ConnectorError (an
        Envelope that does not decode is refused with its wire code); nothing was sent."""
        try:
            action, opened = decode_action(payload)
        except EnvelopeRejected as exc:
            raise ConnectorError(exc.code, exc.reason) from None
        signer = self.verify_action_signer(opened.verified)
        return await self.admit_verified(
            action=action, signer=signer, endpoint=endpoint, spec=spec, stores=stores
        )

    async def admit_verified(
        self,
        *,
        action: Action,
        signer: str | None,
        endpoint: Endpoint,
        spec: OperationSpec,
        stores: Stores,
        stored_at_ms: int | None = None,
        deadline_unix_ms: int | None = None,
    ) -> AdmitDecision:
        """`admit` for an envelope whose signature the caller already verified (`signer` is
        that result): the runtime verifies once, to decide DLQ or not, and never twice.

        `stored_at_ms` is when JetStream stored the envelope's message (the replay window is
        judged against it, `worker.trust.replay`); `deadline_unix_ms` the runtime's
        effective deadline, which the provider's `X-AIP-Deadline-Unix-Ms` header carries."""
        if self.identities is None:
            raise ConnectorError(
                ErrorCode.HOST_AUTHENTICATION,
                "no trusted identity directory is configured (AIPD_TRUSTED_IDENTITY_FILE); "
                "governed execution is refused",
            )
        clock = stores.clock()
        recorded = None
        if spec.approval_required and self.authority is not None:
            # Read first (no effect) so its Redis TIME also decides the replay check: one
            # round trip for both. Its verdict still comes after identity, in order.
            recorded = await prefetch_record(stores.approvals, action.id, clock)
        await self.replay.check(action.created_at_unix_ms, clock, stored_at_ms=stored_at_ms)
        identity = await self.identities.verify(action.identity, clock)
        check_route(action.capability, endpoint)
        await check_endpoint_tenant(endpoint, identity.tenant_id, clock)
        source = resume_source(spec.name, action)
        if source is not None:
            await check_resume(
                source_action_id=source,
                action=action,
                identity=identity,
                authority=self.authority,
                stores=stores,
                clock=clock,
            )
        quorum = None
        if spec.approval_required:
            quorum = await check_approval(
                stores.approvals,
                self.authority,
                action,
                tenant_id=identity.tenant_id,
                clock=clock,
                recorded=recorded,
            )
        return AdmitDecision(
            signer=signer,
            identity=identity,
            approval=quorum.primary if quorum is not None else None,
            headers=trusted_projection(action, identity, deadline_unix_ms=deadline_unix_ms),
            approvals=quorum.records if quorum is not None else (),
        )

    async def authorize_cancel(
        self, *, requested_by: str, subject: ActionSubject | None, stores: Stores
    ) -> None:
        """May `requested_by` cancel the Action whose lease recorded `subject` (None: not
        leased yet, so only the requester is checked now; the leasing worker checks the
        rest)? Raises ConnectorError (see `worker.trust.cancel_authority`)."""
        clock = stores.clock()
        requester = await self.cancels.requester(requested_by, clock)
        if subject is not None:
            await self.cancels.check(requester, subject, clock)

    async def check_fresh(self, sent_at_unix_ms: int, stores: Stores, message_id: str) -> None:
        """A request no stream stores (a cancel) is judged on its `sent_at` against Redis
        TIME: at most the envelope age old, at most the clock skew ahead; and its
        `message_id` is claimed once for as long as that `sent_at` could pass, so a captured
        request cannot be sent again (`connector_host.replay` otherwise, as AIP gateways
        claim each `message_id` once)."""
        await self.replay.check(sent_at_unix_ms, stores.clock())
        claimed = await stores.client.set(
            request_id_key(message_id), b"1", nx=True, px=self.replay.span_ms
        )
        if not claimed:
            raise ConnectorError(
                ErrorCode.HOST_REPLAY, "this request's message_id was already used"
            )

    def verify_strict(self, payload: bytes, headers: Mapping[str, str]) -> str:
        """A valid signature of a trusted key, whatever AIPD_ALLOW_UNSIGNED_ENVELOPES says."""
        if self.gateway_keys is None:
            raise ConnectorError(
                ErrorCode.HOST_AUTHENTICATION,
                "no trusted gateway keys are configured (AIPD_TRUSTED_GATEWAY_KEYS_FILE)",
            )
        return verify_envelope(payload, headers, self.gateway_keys)

    async def check_delegated_child(
        self,
        stores: Stores,
        child: Action,
        *,
        delegator_id: str,
        tenant_id: str | None,
        decision_id: str | None,
    ) -> ApprovalRecord:
        """The connector-level delegation approval (overview "Router Policy"): a terminal
        approved record in the approval store for the exact child Action id, capability and
        input, in the verified tenant, by an approver who is neither the child's principal
        nor the delegator; `decision_id` (the request's approval reference), when given,
        must name that record. Payload claims alone are never authority."""
        quorum = await check_approval(
            stores.approvals, self.authority, child, tenant_id=tenant_id, clock=stores.clock()
        )
        if any(r.approver_principal_id == delegator_id for r in quorum.records):
            raise ConnectorError(
                ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT,
                "approval: the approver is the delegator of this child",
            )
        named = [r for r in quorum.records if decision_id in (None, r.decision_id)]
        if not named:
            raise ConnectorError(
                ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT,
                "approval: the delegation's decision_id is not the recorded decision",
            )
        return named[0]


def _carries_signature(headers: Mapping[str, str]) -> bool:
    names = {SIGNER_HEADER.lower(), SIGNATURE_HEADER.lower()}
    return any(key.lower() in names for key in headers)
