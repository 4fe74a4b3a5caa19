"""One delivery from `aip.hermes.{endpoint}.delegations`, start to finish.

The same order as an Action (DESIGN §6) and the same runtime after admission:

1. decode strictly (over-size or invalid -> DLQ with the reason, `term()`);
2. verify the gateway signature (bad or missing -> DLQ: an unauthenticated envelope is not
   trusted even for its delegation id);
3. the router policy (`worker.delegation.router`), the delegator's identity and the
   endpoint's tenant binding, the child's tenant, and, unless exempted by prefix, the
   durable approval of the exact child; a refusal settles one failed result under the
   delegation's Action id, so the gateway learns why (a permanent policy denial is settled
   once and never retried);
4. the leased path of `DeliveryHandler.run`: lease, heartbeat, the delegated operator run,
   fenced settle, terminal chunk and result on the delegation's Action id, ack.
"""

from __future__ import annotations

import hashlib
import logging

from nats.aio.msg import Msg

from schemas.audit import ReceiptEvent
from schemas.codec import EnvelopeRejected, decode_delegation
from schemas.errors import ErrorCode
from worker.delegation.entry import internal_action
from worker.delegation.operation import DelegatedOperation
from worker.delegation.router import check_child_tenant, check_route_policy
from worker.delivery import DeliveryHandler, Refusal, _quiet
from worker.errors import ConnectorError
from worker.execution import now_ms
from worker.metrics import DeliveryOutcome
from worker.store.keys import ActionKeys

log = logging.getLogger(__name__)


class DelegationHandler:
    def __init__(self, delivery: DeliveryHandler, operation: DelegatedOperation) -> None:
        self.delivery = delivery
        self.rt = delivery.rt
        self.operation = operation

    async def handle(self, msg: Msg, endpoint_id: str) -> None:
        """Never raises: bad input or a failing dependency must not stop the consumer loop."""
        try:
            await self._handle(msg, endpoint_id)
        except Exception:
            log.exception(
                "delegation delivery failed unexpectedly on %s; redelivering later",
                endpoint_id,
                extra={"endpoint": endpoint_id},
            )
            self.rt.metrics.delivery(endpoint_id, DeliveryOutcome.ERROR)
            await _quiet(msg.nak(delay=self.rt.settings.nak_delay_ms / 1000))

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
                msg, endpoint_id, exc.code, exc.message, action_id=action.id
            )
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
        try:
            ep = rt.endpoints.get(endpoint_id)
            if ep is None:
                raise Refusal(
                    ConnectorError(
                        ErrorCode.HOST_ROUTE_MISMATCH, f"endpoint {endpoint_id!r} is not served"
                    ),
                    read_only=False,
                )
            try:
                check_route_policy(request, ep.endpoint, operation.policy)
                trusted, tenant_id = await rt.admission.admit_delegation(
                    action=action,
                    child=request.action,
                    payload=payload,
                    headers=headers,
                    endpoint=ep.endpoint,
                    spec=operation.spec,
                    redis=rt.store.redis,
                    child_approval=operation.policy.delegation_needs_approval(
                        request.action.capability
                    ),
                )
                check_child_tenant(request, ep.endpoint, tenant_id)
            except ConnectorError as exc:
                raise Refusal(exc, read_only=False) from None
            deadline_ms = self.delivery.deadline_of(action, operation.spec)
            if deadline_ms <= now_ms():
                raise Refusal(
                    ConnectorError(
                        ErrorCode.DEADLINE_EXCEEDED,
                        "the delegation's deadline passed before it was started",
                        uncertain_outcome=False,
                    ),
                    read_only=False,
                )
        except Refusal as refusal:
            log.info(
                "delegation %s refused: %s",
                action.id,
                refusal.error.code.value,
                extra={"endpoint": endpoint_id, "action_id": action.id},
            )
            await self.delivery.refuse(msg, action, keys, endpoint_id, refusal)
            return
        await self.delivery.run(msg, action, keys, ep, operation, request, trusted, deadline_ms)
