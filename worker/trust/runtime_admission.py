"""`GateAdmission`: the `worker.admission.Admission` the runtime wires in (`worker.wiring`).

The runtime's protocol takes the provider headers, the verified tenant and the redacted
facts of the `admitted` receipt from `admit`; `admit_decision` returns the gate's whole
`AdmitDecision` (signer, principal, tenant, approval).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from schemas.action import Action
from worker.admission import Admitted
from worker.endpoints import Endpoint
from worker.operations.base import OperationSpec
from worker.settings import Settings
from worker.store.lease_store import ActionSubject
from worker.trust.gate import AdmitDecision, TrustGate

if TYPE_CHECKING:
    from worker.store.stores import Stores


class GateAdmission:
    """The trust gate behind the runtime's two-step admission protocol."""

    def __init__(self, gate: TrustGate) -> None:
        self.gate = gate

    @classmethod
    def from_settings(cls, settings: Settings) -> GateAdmission:
        return cls(TrustGate.from_settings(settings))

    def verify_signature(self, payload: bytes, headers: Mapping[str, str]) -> str | None:
        return self.gate.verify_signature(payload, headers)

    async def admit_decision(
        self,
        *,
        action: Action,
        signer: str | None,
        endpoint: Endpoint,
        spec: OperationSpec,
        stores: Stores,
    ) -> AdmitDecision:
        return await self.gate.admit_verified(
            action=action, signer=signer, endpoint=endpoint, spec=spec, stores=stores
        )

    async def admit(
        self,
        *,
        action: Action,
        signer: str | None,
        endpoint: Endpoint,
        spec: OperationSpec,
        stores: Stores,
    ) -> Admitted:
        decision = await self.admit_decision(
            action=action, signer=signer, endpoint=endpoint, spec=spec, stores=stores
        )
        return Admitted(
            headers=decision.headers,
            tenant_id=decision.tenant_id,
            receipt_details=decision.receipt_details(),
        )

    async def check_delegated_approval(
        self,
        *,
        child: Action,
        delegator_id: str,
        tenant_id: str | None,
        decision_id: str | None,
        stores: Stores,
    ) -> None:
        await self.gate.check_delegated_child(
            stores, child, delegator_id=delegator_id, tenant_id=tenant_id, decision_id=decision_id
        )

    async def authorize_cancel(
        self, *, requested_by: str, subject: ActionSubject | None, stores: Stores
    ) -> None:
        await self.gate.authorize_cancel(requested_by=requested_by, subject=subject, stores=stores)

    def verify_record(self, payload: bytes, headers: Mapping[str, str]) -> str:
        return self.gate.verify_strict(payload, headers)
