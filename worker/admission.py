"""What the runtime asks of the trust layer before anything reaches a provider.

Two steps, because they fail differently: an envelope whose *signature* fails cannot be
trusted even for its Action id, so it goes to the DLQ and touches no Action state (otherwise
a forger could settle, or poison the fingerprint of, someone else's Action id). A signed
envelope refused for its identity, tenant or approval is answered with a settled, failed
ActionResult, so its publisher learns why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from schemas.action import Action
from schemas.audit import DetailValue
from worker.endpoints import Endpoint
from worker.operations.base import OperationSpec
from worker.store.lease_store import ActionSubject

if TYPE_CHECKING:
    from worker.store.stores import Stores


@dataclass(frozen=True, slots=True)
class Admitted:
    """What admitted an envelope: the trusted provider headers and the verified tenant."""

    headers: Mapping[str, str]
    tenant_id: str | None
    #: Redacted facts for the `admitted` receipt (signer, principal, tenant, approver,
    #: decision id): ids and revisions only, never a credential.
    receipt_details: Mapping[str, DetailValue] = field(default_factory=dict)


class Admission(Protocol):
    def verify_signature(self, payload: bytes, headers: Mapping[str, str]) -> str | None:
        """The verified signer (None when unsigned input is allowed); raises ConnectorError."""
        ...

    async def admit(
        self,
        *,
        action: Action,
        signer: str | None,
        endpoint: Endpoint,
        spec: OperationSpec,
        stores: Stores,
    ) -> Admitted:
        """Check identity, tenant and approval of an envelope whose signature was verified
        (`signer`, from `verify_signature`); return the trusted headers and tenant. An
        Action or a delegation's internal Action alike.

        Raises ConnectorError with the refusal code; nothing has been sent to Hermes then.
        """
        ...

    async def check_delegated_approval(
        self,
        *,
        child: Action,
        delegator_id: str,
        tenant_id: str | None,
        decision_id: str | None,
        stores: Stores,
    ) -> None:
        """The durable approval of the exact delegated `child`; raises ConnectorError."""
        ...

    async def authorize_cancel(
        self, *, requested_by: str, subject: ActionSubject | None, stores: Stores
    ) -> None:
        """May `requested_by` cancel the Action whose lease recorded `subject`? With None
        (no worker leased it yet) only the requester's identity is checked. Raises
        ConnectorError with the refusal code; nothing has been recorded then."""
        ...

    def verify_record(self, payload: bytes, headers: Mapping[str, str]) -> str:
        """A trusted-key signature over a store record; never waived by the unsigned-envelope
        development flag (records are evidence). Raises ConnectorError."""
        ...
