"""The pipeline's intake of `aip.hermes.{endpoint}.delegations` (docs/architecture.md §4).

The same order as an Action, the same pipeline (`worker.pipeline.Pipeline`):

1. decode strictly (over-size or invalid -> DLQ with the reason, `term()`);
2. verify the AIP signature of the `aip.agent.v1.delegation_request` Envelope
   (`worker.wire.delegations`; bad, missing or not a trusted gateway key -> DLQ: an
   unauthenticated envelope is not trusted even for its delegation id, so its receipt goes
   under the DLQ entry's id), and
   that a `Nats-Msg-Id`, when present, is the delegation's Action id bound to the request's
   bytes (`subjects.grammar.envelope_msg_id`; else DLQ);
3. the steps, in the runbook's order: the endpoint is served and this worker can sign;
   the delegator's identity and the endpoint's tenant binding, the router policy
   (`worker.delegation.router`), unless exempted by prefix the durable approval of the
   exact child, the child's tenant; the deadline. A refusal settles one failed result under
   the delegation's Action id, so the gateway learns why (a permanent policy denial is
   settled once and never retried), unless an earlier delivery already created the
   delegation's binding: then the refusal only forbids a new start, and what exists is
   observed, stopped or resolved on the leased path;
4. the leased path every intake shares: lease, heartbeat, the delegated operator run,
   fenced settle, terminal chunk and result on the delegation's Action id, ack.
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg

from schemas.audit import ReceiptEvent
from schemas.delegation import DelegationRequest
from schemas.errors import EnvelopeRejected, ErrorCode
from subjects.grammar import envelope_msg_id
from worker.delegation.entry import internal_action
from worker.delegation.operation import DelegatedOperation
from worker.delegation.router import check_child_tenant, check_route_policy
from worker.errors import ConnectorError, Refusal, Rejected
from worker.pipeline.delivery import Delivery, Step
from worker.pipeline.runtime import Runtime
from worker.pipeline.steps import (
    check_msg_id,
    deadline_of,
    live_deadline,
    received,
    require_signer,
)
from worker.wire.delegations import decode_delegation

log = logging.getLogger(__name__)


class DelegationIntake:
    """A DelegationRequest, run as its internal operator Action (`worker.delegation.entry`)."""

    def __init__(self, rt: Runtime, operation: DelegatedOperation) -> None:
        self.rt = rt
        self.operation = operation
        self.steps: tuple[Step, ...] = (self.serve, self.admit, self.schedule)

    async def open(self, msg: Msg, endpoint_id: str) -> Delivery:
        rt = self.rt
        headers = dict(msg.headers or {})
        try:
            request, opened = decode_delegation(
                msg.data, max_bytes=rt.settings.max_envelope_bytes
            )
        except EnvelopeRejected as exc:
            raise Rejected(exc.code, exc.reason) from None
        action = internal_action(request, endpoint_id)
        try:
            signer = rt.gate.verify_action_signer(opened.verified)
        except ConnectorError as exc:
            raise Rejected(exc.code, exc.message, claimed_action_id=action.id) from None
        check_msg_id(headers, action.id, envelope_msg_id(action.id, msg.data))
        received(
            rt,
            msg,
            endpoint_id,
            action,
            signer,
            delegation_id=request.delegation_id,
            child_action_id=request.action.id,
            child_capability=request.action.capability,
        )
        return Delivery(
            msg=msg,
            endpoint_id=endpoint_id,
            action=action,
            keys=self.operation.keys(action),
            signer=signer,
            ep=rt.endpoints.get(endpoint_id),
            operation=self.operation,
            params=request,
        )

    def refused(self, delivery: Delivery, refusal: Refusal) -> None:
        log.info(
            "delegation %s refused: %s",
            delivery.action.id,
            refusal.error.code.value,
            extra={"endpoint": delivery.endpoint_id, "action_id": delivery.action.id},
        )

    async def serve(self, delivery: Delivery) -> Delivery:
        """The endpoint is served here and this worker can sign what it answers."""
        if delivery.ep is None:
            raise Refusal(
                ConnectorError(
                    ErrorCode.HOST_ROUTE_MISMATCH,
                    f"endpoint {delivery.endpoint_id!r} is not served",
                ),
                read_only=False,
            )
        require_signer(self.rt)
        return delivery

    async def admit(self, delivery: Delivery) -> Delivery:
        """Trust and routing in the runbook's order; the trusted headers."""
        rt = self.rt
        operation = self.operation
        request: DelegationRequest = delivery.params
        assert delivery.ep is not None
        endpoint = delivery.ep.endpoint
        child = request.action
        deadline_ms = deadline_of(delivery.action, operation.spec)
        try:
            # Authentication first (identity directory, route, endpoint tenant binding).
            admitted = await rt.gate.admit_verified(
                action=delivery.action,
                signer=delivery.signer,
                endpoint=endpoint,
                spec=operation.spec,
                stores=rt.stores,
                stored_at_ms=delivery.stored_at_ms,
                deadline_unix_ms=deadline_ms,
            )
            tenant_id = admitted.tenant_id
            rt.audit.emit(
                ReceiptEvent.ADMITTED,
                action_id=delivery.action.id,
                endpoint_id=endpoint.id,
                facts=admitted.receipt_details(),
            )
            check_route_policy(request, endpoint, operation.policy)
            if operation.policy.delegation_needs_approval(child.capability):
                await rt.gate.check_delegated_child(
                    rt.stores,
                    child,
                    delegator_id=request.delegator.principal_id,
                    tenant_id=tenant_id,
                    decision_id=request.approval.decision_id if request.approval else None,
                )
            check_child_tenant(request, endpoint, tenant_id)
        except ConnectorError as exc:
            raise Refusal(exc, read_only=False) from None
        return delivery.having(trusted=admitted.headers, deadline_ms=deadline_ms)

    async def schedule(self, delivery: Delivery) -> Delivery:
        """The deadline admission decided, unless it has already passed."""
        deadline_ms = live_deadline(
            delivery.action, self.operation.spec, "the delegation", delivery.deadline_ms
        )
        return delivery.having(deadline_ms=deadline_ms)
