"""Channel egress: a matching result or escalation, sent once into a persisted Hermes session.

Two halves, both on the runtime's fenced path:

1. `deliveries_for` (called by the pipeline right after the settling owner's fenced
   settle, or when a stored result is republished) turns a source into `ChannelDelivery`
   records for the work queue `aip.hermes.{endpoint}.egress`, each sent as the signed
   `aip.core.v1.action` Envelope of its `session_chat` Action (`worker.wire.channels`),
   under `Nats-Msg-Id` = the delivery id derived from the rule and the source: a
   republish is a server-side duplicate.
2. `EgressIntake` (the pipeline's intake of that queue) runs each delivery as the internal
   delivery Action `delivery_id` of capability `session_chat` through the pipeline's
   leased path: lease, fence, the unsafe-attempt mark before the one
   `POST /api/sessions/{session_id}/chat`, settle, chunks and result. A takeover after
   the mark settles `transport` with `uncertain_outcome: true` instead of posting again;
   an ambiguous answer is settled the same way; a redelivery of a settled delivery
   republishes its stored result.

A delivery's own result or escalation is never delivered again (no loops): the internal
Action runs as `CHANNEL_PRINCIPAL`, which `deliveries_for` skips.

The egress queue is not trusted for what it says, only for what it names. A delivery's
Envelope must be signed (`security.signature`) by a trusted worker key (`worker_trust`:
this worker's own key plus `AIPD_TRUSTED_WORKER_KEYS_FILE`), and its text is never taken
from the message: the intake reads the source's settled result from Redis (and the tenant
its lease recorded), recomputes what the rule makes of it (`result_message`, or the
escalation the stored result raises, `escalation_for`), and refuses a delivery naming a
source that is not settled, a rule that does not match that source, a tenant other than the
target endpoint's, or a message other than the recomputed one. So a `ChannelDelivery` forged by
anyone with publish rights on `aip.hermes.*.egress` is dead-lettered and sends nothing.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from nats.aio.msg import Msg

from schemas.action import Action, Identity
from schemas.audit import ReceiptEvent
from schemas.channel import ChannelDelivery, ChannelSource
from schemas.codec import convert_input
from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.escalation import Escalation
from schemas.result import ActionResult
from worker.channel.normalize import escalation_message, result_message
from worker.channel.rules import EgressRule, EgressTable
from worker.errors import Refusal, Rejected, UnverifiedResponse
from worker.escalation.build import escalation_for
from worker.pipeline.delivery import Delivery, Step
from worker.pipeline.runtime import Runtime
from worker.pipeline.steps import check_msg_id
from worker.store.clock import now_ms
from worker.trust.responses import check_worker_signed
from worker.trust.signing import TrustedGatewayKeys
from worker.wire.channels import (
    CHANNEL_PRINCIPAL,
    DELIVERY_OPERATION,
    decode_delivery,
    delivery_action,
)
from worker.wire.envelopes import Opened
from worker.wire.results import decode_result

log = logging.getLogger(__name__)

def delivery_id(rule_id: str, source_id: str) -> str:
    """The delivery Action's id: one per rule and source, so a redelivery is idempotent."""
    return "act_" + hashlib.sha256(f"channel:{rule_id}:{source_id}".encode()).hexdigest()[:32]


def deliveries_for(
    table: EgressTable,
    result: ActionResult,
    action: Action,
    escalation: Escalation | None,
) -> list[ChannelDelivery]:
    """What the rules send for this settled result and the escalation it raised."""
    if action.identity.principal_id == CHANNEL_PRINCIPAL:
        return []
    tenant = action.identity.tenant_id
    out: list[ChannelDelivery] = []
    sources: list[tuple[ChannelSource, str]] = [(ChannelSource.RESULT, result.action_id)]
    if escalation is not None:
        sources.append((ChannelSource.ESCALATION, escalation.escalation_id))
    for source, source_id in sources:
        for rule in table.matching(source, result.endpoint_id, result.capability, tenant):
            if source is ChannelSource.RESULT:
                message = result_message(result, rule.max_message_bytes)
            else:
                assert escalation is not None
                message = escalation_message(escalation, rule.max_message_bytes)
            out.append(
                ChannelDelivery(
                    delivery_id=delivery_id(rule.id, source_id),
                    rule_id=rule.id,
                    source=source,
                    source_action_id=result.action_id,
                    source_id=source_id,
                    endpoint_id=rule.endpoint_id,
                    session_id=rule.session_id,
                    message=message,
                    created_at_unix_ms=result.settled_at_unix_ms,
                )
            )
    return out


class EgressIntake:
    """The pipeline's intake of `aip.hermes.{endpoint}.egress`: only what a trusted worker
    queued, for a settled source a configured rule matches, with the text that source
    makes, is run; anything else is dead-lettered (module docstring)."""

    steps: tuple[Step, ...] = ()

    def __init__(
        self,
        rt: Runtime,
        table: EgressTable,
        *,
        trusted: TrustedGatewayKeys | None,
        approval_ttl_ms: int,
    ) -> None:
        self.rt = rt
        self.table = table
        #: The worker keys whose deliveries are believed (None: unsigned allowed, dev only).
        self.trusted = trusted
        #: The escalation output's TTL, so a recomputed escalation has the same deadline.
        self.approval_ttl_ms = approval_ttl_ms

    async def open(self, msg: Msg, endpoint_id: str) -> Delivery:
        rt = self.rt
        try:
            request, opened = decode_delivery(msg.data)
        except EnvelopeRejected as exc:
            if exc.code is ErrorCode.HOST_AUTHENTICATION:  # a signature that does not verify
                raise Rejected(
                    ErrorCode.HOST_RESPONSE_SIGNING, f"channel delivery: {exc.reason}"
                ) from None
            raise Rejected(exc.code, exc.reason) from None
        self._check_signer(opened)
        refusal = self._refusal(request, endpoint_id)
        if refusal is not None:
            raise Rejected(ErrorCode.CONFIGURATION_OR_INPUT, refusal)
        check_msg_id(dict(msg.headers or {}), request.delivery_id)
        rule = self.table.rule(request.rule_id)
        assert rule is not None  # _refusal checked it
        await self._check_source(request, rule)
        action = delivery_action(request)
        operation = rt.registry.get(DELIVERY_OPERATION)
        if operation is None:
            raise Rejected(
                ErrorCode.CONFIGURATION_OR_INPUT,
                f"operation {DELIVERY_OPERATION} is not published by this worker",
            )
        params: Any = convert_input(action.input, operation.spec.input_type)
        rt.audit.emit(
            ReceiptEvent.RECEIVED,
            action_id=action.id,
            endpoint_id=endpoint_id,
            capability=action.capability,
            channel_rule=request.rule_id,
            source_id=request.source_id,
        )
        rt.metrics.channel_delivery(endpoint_id, request.source.value)
        return Delivery(
            msg=msg,
            endpoint_id=endpoint_id,
            action=action,
            keys=operation.keys(action),
            ep=rt.endpoints[endpoint_id],
            operation=operation,
            params=params,
            deadline_ms=now_ms() + operation.spec.timeout_ms,
        )

    def refused(self, delivery: Delivery, refusal: Refusal) -> None:
        """Never called: an egress delivery has no refusing step."""

    def _check_signer(self, opened: Opened) -> None:
        """A trusted worker key signed the delivery's Envelope (whose signature
        `decode_delivery` verified); anything else is dead-lettered."""
        if self.trusted is None:
            if self.rt.settings.allow_unsigned_responses:
                return  # development: this worker publishes its deliveries unsigned too
            raise Rejected(
                ErrorCode.HOST_RESPONSE_SIGNING,
                "this worker trusts no worker key (AIPD_WORKER_SIGNING_KEY_FILE, "
                "AIPD_TRUSTED_WORKER_KEYS_FILE); channel deliveries cannot be verified",
            )
        try:
            check_worker_signed(opened, self.trusted, what="channel delivery")
        except UnverifiedResponse as exc:
            raise Rejected(ErrorCode.HOST_RESPONSE_SIGNING, f"channel delivery: {exc}") from None

    def _refusal(self, request: ChannelDelivery, endpoint_id: str) -> str | None:
        """Why this delivery may not run here, or None: only what a configured rule sends."""
        rule = self.table.rule(request.rule_id)
        if rule is None:
            return f"no channel rule {request.rule_id!r} is configured"
        if (rule.endpoint_id, rule.session_id) != (endpoint_id, request.session_id):
            return f"rule {rule.id!r} does not deliver to this endpoint and session"
        if request.delivery_id != delivery_id(rule.id, request.source_id):
            return "the delivery id is not derived from its rule and source"
        if len(request.message.encode()) > rule.max_message_bytes:
            return f"the message is over the rule's {rule.max_message_bytes} bytes"
        return None

    async def _check_source(self, request: ChannelDelivery, rule: EgressRule) -> None:
        """The delivery's text is exactly what `rule` makes of its settled source, whose
        lease-recorded tenant is the target endpoint's; Rejected otherwise."""
        leases = self.rt.stores.leases
        keys = await leases.keys_of(request.source_action_id)
        stored, _, _ = await leases.get_settled(keys)
        subject = await leases.cancel_subject(keys)
        if stored is None or subject is None:
            raise Rejected(
                ErrorCode.CONFIGURATION_OR_INPUT,
                f"source {request.source_action_id} is not settled here",
            )
        try:
            result, _ = decode_result(stored)
        except EnvelopeRejected:
            raise Rejected(
                ErrorCode.CONFIGURATION_OR_INPUT,
                f"the stored result of {request.source_action_id} does not decode",
            ) from None
        if result.action_id != request.source_action_id or subject.principal_id == (
            CHANNEL_PRINCIPAL
        ):
            raise Rejected(
                ErrorCode.CONFIGURATION_OR_INPUT,
                f"source {request.source_action_id} is not a deliverable result",
            )
        tenant = subject.tenant_id
        if not rule.admits(tenant):
            raise Rejected(
                ErrorCode.TENANT_MISMATCH,
                f"rule {rule.id!r}: the source's tenant may not read session "
                f"{rule.session_id!r} of endpoint {rule.endpoint_id!r}; nothing was sent",
            )
        expires = self.rt.endpoints[rule.endpoint_id].endpoint.descriptor.tenant_expires_at_unix_ms
        if expires is not None and await self.rt.stores.clock().now_ms() >= expires:
            raise Rejected(
                ErrorCode.TENANT_MISMATCH,
                f"endpoint {rule.endpoint_id!r}: its tenant binding has expired; nothing was sent",
            )
        if not rule.matches(request.source, result.endpoint_id, result.capability, tenant):
            raise Rejected(
                ErrorCode.CONFIGURATION_OR_INPUT,
                f"rule {rule.id!r} does not match source {request.source_action_id}",
            )
        expected = self._message(request, rule, result, subject.principal_id, tenant)
        if expected is None or expected != request.message:
            raise Rejected(
                ErrorCode.CONFIGURATION_OR_INPUT,
                "the delivery is not what its rule makes of its stored source",
            )

    def _message(
        self,
        request: ChannelDelivery,
        rule: EgressRule,
        result: ActionResult,
        principal_id: str,
        tenant: str | None,
    ) -> str | None:
        """What `rule` sends for this source, recomputed from the stored result; None when
        the named source id is not one the result makes."""
        if request.source is ChannelSource.RESULT:
            if request.source_id != result.action_id:
                return None
            return result_message(result, rule.max_message_bytes)
        # The escalation is a pure function of the stored result (worker/escalation/build.py);
        # the Action stands in only for identity fields the message does not show.
        stand_in = Action(
            id=result.action_id,
            capability=result.capability,
            input={},
            identity=Identity(
                principal_id=principal_id, principal_kind="unknown", tenant_id=tenant
            ),
            created_at_unix_ms=result.settled_at_unix_ms,
        )
        escalation = escalation_for(result, stand_in, approval_ttl_ms=self.approval_ttl_ms)
        if escalation is None or escalation.escalation_id != request.source_id:
            return None
        return escalation_message(escalation, rule.max_message_bytes)


async def check_sessions(table: EgressTable, endpoints: dict[str, Any]) -> None:
    """Refuse to start when a rule's session does not exist (ChannelConfigError, exit 2);
    an endpoint that does not answer is an OSError (exit 3)."""
    from worker.errors import ChannelConfigError, ConnectorError

    for endpoint_id, session_id in sorted(table.targets()):
        hermes = endpoints[endpoint_id].hermes
        try:
            await hermes.request_json(
                "GET", "/api/sessions/{session_id}", {"session_id": session_id}
            )
        except ConnectorError as exc:
            if exc.remote_status == 404:
                raise ChannelConfigError(
                    f"AIPD_CHANNEL_EGRESS_FILE: session {session_id!r} does not exist on "
                    f"endpoint {endpoint_id!r}"
                ) from None
            raise OSError(
                f"cannot check session {session_id!r} on endpoint {endpoint_id!r}: {exc.code.value}"
            ) from None
