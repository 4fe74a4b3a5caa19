"""One delivery from `aip.hermes.{endpoint}.delegations`, start to finish.

The same order as an Action (docs/architecture.md §4) and the same runtime after admission:

1. decode strictly (over-size or invalid -> DLQ with the reason, `term()`);
2. verify the gateway signature (bad or missing -> DLQ: an unauthenticated envelope is not
   trusted even for its delegation id, so its receipt goes under the DLQ entry's id), and
   that a `Nats-Msg-Id`, when present, is the delegation's Action id (else DLQ);
3. trust and routing in the runbook's order: the delegator's identity and the endpoint's
   tenant binding, the router policy (`worker.delegation.router`), unless exempted by
   prefix the durable approval of the exact child, the child's tenant, the deadline; a
   refusal settles one failed result under the delegation's Action id, so the gateway
   learns why (a permanent policy denial is settled once and never retried) — unless an
   earlier delivery already created the delegation's binding: then the refusal only forbids
   a new start, and what exists is observed, stopped or resolved on the leased path;
4. the leased path of `DeliveryHandler.run`: lease, heartbeat, the delegated operator run,
   fenced settle, terminal chunk and result on the delegation's Action id, ack.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping

from nats.aio.msg import Msg

from schemas.action import Action
from schemas.audit import ReceiptEvent
from schemas.codec import decode_delegation
from schemas.delegation import DelegationRequest
from schemas.errors import EnvelopeRejected, ErrorCode
from worker.delegation.entry import internal_action
from worker.delegation.operation import DelegatedOperation
from worker.delegation.router import check_child_tenant, check_route_policy
from worker.delivery import DeliveryHandler, EndpointRuntime, Refusal
from worker.errors import ConnectorError
from worker.store.keys import ActionKeys

log = logging.getLogger(__name__)


class DelegationHandler:
    def __init__(self, delivery: DeliveryHandler, operation: DelegatedOperation) -> None:
        self.delivery = delivery
        self.rt = delivery.rt
        self.operation = operation

    async def handle(self, msg: Msg, endpoint_id: str) -> None:
        await self.delivery.guarded(self._handle, msg, endpoint_id)

    async def _handle(self, msg: Msg, endpoint_id: str) -> None:
        rt = self.rt
        payload = msg.data
        headers = dict(msg.headers or {})
        try:
            request = decode_delegation(payload, max_bytes=rt.settings.max_envelope_bytes)
        except EnvelopeRejected as exc:
            await self.delivery.dead_letter(msg, endpoint_id, exc.code, exc.reason)
            return
        action = internal_action(request, endpoint_id)
        try:
            signer = rt.admission.verify_signature(payload, headers)
        except ConnectorError as exc:
            await self.delivery.dead_letter(
                msg, endpoint_id, exc.code, exc.message, claimed_action_id=action.id
            )
            return
        if not await self.delivery.msg_id_matches(msg, endpoint_id, headers, action.id):
            return
        rt.audit.emit(
            ReceiptEvent.RECEIVED,
            action_id=action.id,
            endpoint_id=endpoint_id,
            trace_id=action.trace.trace_id if action.trace else None,
            envelope_sha256=hashlib.sha256(payload).hexdigest(),
            signer=signer,
            capability=action.capability,
            delegation_id=request.delegation_id,
            child_action_id=request.action.id,
            child_capability=request.action.capability,
        )
        keys = ActionKeys.of(action.id)
        operation = self.operation
        ep = rt.endpoints.get(endpoint_id)
        try:
            if ep is None:
                raise Refusal(
                    ConnectorError(
                        ErrorCode.HOST_ROUTE_MISMATCH, f"endpoint {endpoint_id!r} is not served"
                    ),
                    read_only=False,
                )
            self.delivery.require_signer()
            trusted, deadline_ms = await self._admit(request, action, ep, signer)
        except Refusal as refusal:
            log.info(
                "delegation %s refused: %s",
                action.id,
                refusal.error.code.value,
                extra={"endpoint": endpoint_id, "action_id": action.id},
            )
            await self.delivery.recover_or_refuse(
                msg, action, keys, endpoint_id, ep, operation, request, refusal
            )
            return
        await self.delivery.run(msg, action, keys, ep, operation, request, trusted, deadline_ms)

    async def _admit(
        self,
        request: DelegationRequest,
        action: Action,
        ep: EndpointRuntime,
        signer: str | None,
    ) -> tuple[Mapping[str, str], int]:
        """Trust and routing in the runbook's order; returns the headers and the deadline."""
        rt = self.rt
        operation = self.operation
        child = request.action
        try:
            # Authentication first (identity directory, route, endpoint tenant binding).
            admitted = await rt.admission.admit(
                action=action,
                signer=signer,
                endpoint=ep.endpoint,
                spec=operation.spec,
                stores=rt.stores,
            )
            tenant_id = admitted.tenant_id
            rt.audit.emit(
                ReceiptEvent.ADMITTED,
                action_id=action.id,
                endpoint_id=ep.endpoint.id,
                facts=admitted.receipt_details,
            )
            check_route_policy(request, ep.endpoint, operation.policy)
            if operation.policy.delegation_needs_approval(child.capability):
                await rt.admission.check_delegated_approval(
                    child=child,
                    delegator_id=request.delegator.principal_id,
                    tenant_id=tenant_id,
                    decision_id=request.approval.decision_id if request.approval else None,
                    stores=rt.stores,
                )
            check_child_tenant(request, ep.endpoint, tenant_id)
        except ConnectorError as exc:
            raise Refusal(exc, read_only=False) from None
        deadline_ms = self.delivery.live_deadline(action, operation.spec, "the delegation")
        return admitted.headers, deadline_ms
