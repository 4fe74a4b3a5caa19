"""Steps 1-3 of docs/architecture.md §4 for an Action, and the checks every intake shares.

`ActionIntake.open` decodes the AIP Action Envelope strictly (`worker.wire.actions`), checks
that its signature is a trusted gateway key's and its `Nats-Msg-Id` (each failure is
`Rejected`: dead-lettered, no Action state touched), closes the door when the store gate is
shut, and records the `received` receipt. Its steps then
decide, in order, each refusing with a settled failed result (`Refusal`): the endpoint
serves the capability and this worker can sign its answer; the operation exists and the
Action fits it (idempotency key, mode, input); admission (identity, tenant, approval); the
deadline has not passed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from nats.aio.msg import Msg

from schemas.action import Action
from schemas.audit import DetailValue, ReceiptEvent
from schemas.codec import convert_input
from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.ids import split_capability
from subjects.grammar import envelope_msg_id
from worker import faults
from worker.bus.publisher import MSG_ID
from worker.errors import ConnectorError, Refusal, Rejected, StoreNotAccepting
from worker.operations.base import OperationSpec
from worker.pipeline.delivery import Delivery, Step
from worker.pipeline.runtime import Runtime
from worker.store.clock import now_ms
from worker.store.keys import ActionKeys
from worker.trust.responses import cannot_sign
from worker.wire.actions import claimed_action_id, decode_action


def verified_signer(rt: Runtime, msg: Msg, headers: Mapping[str, str], claimed: str) -> str | None:
    """The gateway signature's signer; an envelope whose signature fails is `Rejected` and
    its receipt goes under the DLQ entry's id: it may claim any Action id (`claimed`)."""
    try:
        return rt.gate.verify_signature(msg.data, headers)
    except ConnectorError as exc:
        raise Rejected(exc.code, exc.message, claimed_action_id=claimed) from None


def check_msg_id(headers: Mapping[str, str], action_id: str, expected: str | None = None) -> None:
    """`Rejected` (`connector_host.replay`) when the envelope's `Nats-Msg-Id` is present and
    is not `expected`: for an Action or a DelegationRequest the id bound to its Action id
    and exact bytes (`subjects.grammar.envelope_msg_id`); by default the bare id (a channel
    delivery, whose id workers derive).

    The stream deduplicates by `Nats-Msg-Id` before any worker sees a message. With the id
    bound to the bytes, a message under another id's slot cannot be the victim's envelope;
    refusing every other value makes a squatter visible in the DLQ. Without the header
    there is no dedupe slot to squat, and the envelope runs (retries of it are then
    deduplicated by `id` alone, in Redis).
    """
    msg_id = headers.get(MSG_ID)
    wanted = action_id if expected is None else expected
    if msg_id is None or msg_id == wanted:
        return
    raise Rejected(
        ErrorCode.HOST_REPLAY,
        f"{MSG_ID} {msg_id[:80]!r} is not the envelope's own ({wanted})",
        action_id=action_id,
    )


def received(
    rt: Runtime,
    msg: Msg,
    endpoint_id: str,
    action: Action,
    signer: str | None,
    **details: DetailValue,
) -> None:
    """The `received` receipt of an authenticated envelope: what arrived (its sha256), who
    signed it, and for which Action and capability."""
    rt.audit.emit(
        ReceiptEvent.RECEIVED,
        action_id=action.id,
        endpoint_id=endpoint_id,
        trace_id=action.trace.trace_id if action.trace else None,
        facts={
            "envelope_sha256": hashlib.sha256(msg.data).hexdigest(),
            "signer": signer,
            "capability": action.capability,
            **details,
        },
    )


def require_signer(rt: Runtime) -> None:
    """A Refusal (`connector_host.response_signing`, answered unsigned) when this worker
    has no signing key and unsigned responses are not allowed: nothing may run."""
    if rt.publisher.signer is None and not rt.settings.allow_unsigned_responses:
        raise Refusal(cannot_sign(), read_only=False)


def deadline_of(action: Action, spec: OperationSpec) -> int:
    """The earliest of the Action's deadline, its timeout, and the operation's own bound."""
    candidates = [now_ms() + spec.timeout_ms]
    if action.deadline_unix_ms is not None:
        candidates.append(action.deadline_unix_ms)
    if action.timeout_ms is not None:
        candidates.append(action.created_at_unix_ms + action.timeout_ms)
    return min(candidates)


def live_deadline(action: Action, spec: OperationSpec, what: str, decided_ms: int = 0) -> int:
    """The execution's deadline (`decided_ms` when admission already decided it, so the
    provider's `X-AIP-Deadline-Unix-Ms` is this very value); a Refusal once it passed."""
    deadline_ms = decided_ms or deadline_of(action, spec)
    if deadline_ms <= now_ms():
        raise Refusal(
            ConnectorError(
                ErrorCode.DEADLINE_EXCEEDED,
                f"{what}'s deadline passed before it was started",
                uncertain_outcome=False,
            ),
            read_only=spec.read_only,
        )
    return deadline_ms


class ActionIntake:
    """An Action from `aip.hermes.{endpoint}.actions`."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.steps: tuple[Step, ...] = (self.serve, self.route, self.admit, self.schedule)

    async def open(self, msg: Msg, endpoint_id: str) -> Delivery:
        rt = self.rt
        headers = dict(msg.headers or {})
        try:
            action, opened = decode_action(msg.data, max_bytes=rt.settings.max_envelope_bytes)
        except EnvelopeRejected as exc:
            claimed = (
                claimed_action_id(msg.data) if exc.code is ErrorCode.HOST_AUTHENTICATION else None
            )
            raise Rejected(exc.code, exc.reason, claimed_action_id=claimed) from None
        faults.hit("after_decode", action.id)
        try:
            signer = rt.gate.verify_action_signer(opened.verified)
        except ConnectorError as exc:
            raise Rejected(exc.code, exc.message, claimed_action_id=action.id) from None
        check_msg_id(headers, action.id, envelope_msg_id(action.id, msg.data))
        health = rt.stores.leases.health
        if health is not None and not health.accepting:
            # Fetched by a pull request sent before the store gate closed: admission and the
            # lease would wait on a failing Redis; nak it for a worker whose store answers.
            raise StoreNotAccepting(f"not admitted: {health.reason}")
        received(rt, msg, endpoint_id, action, signer)
        operation = rt.registry.get(split_capability(action.capability)[1])
        keys = operation.keys(action) if operation is not None else ActionKeys.of(action.id)
        return Delivery(
            msg=msg,
            endpoint_id=endpoint_id,
            action=action,
            keys=keys,
            signer=signer,
            operation=operation,
        )

    def refused(self, delivery: Delivery, refusal: Refusal) -> None:
        """Nothing to add: the `refused` receipt and metric tell it."""

    async def serve(self, delivery: Delivery) -> Delivery:
        """The endpoint is served here, names itself in the capability, and this worker
        can sign what it answers."""
        endpoint_id = delivery.endpoint_id
        ep = self.rt.endpoints[endpoint_id]
        require_signer(self.rt)
        cap_endpoint = split_capability(delivery.action.capability)[0]
        if cap_endpoint != endpoint_id:
            raise Refusal(
                ConnectorError(
                    ErrorCode.HOST_ROUTE_MISMATCH,
                    f"capability names endpoint {cap_endpoint!r}, delivered for {endpoint_id!r}",
                ),
                read_only=False,
            )
        return delivery.having(ep=ep)

    async def route(self, delivery: Delivery) -> Delivery:
        """The operation is published here and the Action fits it: its idempotency key, its
        mode, its input (converted to the operation's params)."""
        action, operation = delivery.action, delivery.operation
        name = split_capability(action.capability)[1]
        if operation is None:
            raise Refusal(
                ConnectorError(
                    ErrorCode.CONFIGURATION_OR_INPUT,
                    f"operation {name!r} is not published by this worker",
                ),
                read_only=False,
            )
        spec = operation.spec
        if spec.idempotency_required and action.idempotency_key is None:
            raise Refusal(
                ConnectorError(
                    ErrorCode.CONFIGURATION_OR_INPUT,
                    f"{name} requires an idempotency_key on the Action",
                ),
                read_only=spec.read_only,
            )
        if action.mode not in spec.modes:
            offered = ", ".join(mode.value for mode in spec.modes)
            raise Refusal(
                ConnectorError(
                    ErrorCode.CONFIGURATION_OR_INPUT,
                    f"{name} does not offer mode {action.mode.value!r} (it offers {offered})",
                ),
                read_only=spec.read_only,
            )
        try:
            params = convert_input(action.input, spec.input_type)
        except EnvelopeRejected as exc:
            raise Refusal(
                ConnectorError(ErrorCode.CONFIGURATION_OR_INPUT, exc.reason),
                read_only=spec.read_only,
            ) from None
        return delivery.having(params=params)

    async def admit(self, delivery: Delivery) -> Delivery:
        """Identity, tenant and approval (`Gate.admit_verified`); the trusted headers, whose
        `X-AIP-Deadline-Unix-Ms` is the effective deadline the execution runs under."""
        rt = self.rt
        assert delivery.ep is not None
        assert delivery.operation is not None
        spec = delivery.operation.spec
        deadline_ms = deadline_of(delivery.action, spec)
        try:
            admitted = await rt.gate.admit_verified(
                action=delivery.action,
                signer=delivery.signer,
                endpoint=delivery.ep.endpoint,
                spec=spec,
                stores=rt.stores,
                stored_at_ms=delivery.stored_at_ms,
                deadline_unix_ms=deadline_ms,
            )
        except ConnectorError as exc:
            raise Refusal(exc, read_only=spec.read_only) from None
        rt.audit.emit(
            ReceiptEvent.ADMITTED,
            action_id=delivery.action.id,
            endpoint_id=delivery.endpoint_id,
            facts=admitted.receipt_details(),
        )
        return delivery.having(trusted=admitted.headers, deadline_ms=deadline_ms)

    async def schedule(self, delivery: Delivery) -> Delivery:
        """The deadline admission decided, unless it has already passed."""
        assert delivery.operation is not None
        deadline_ms = live_deadline(
            delivery.action, delivery.operation.spec, "the Action", delivery.deadline_ms
        )
        return delivery.having(deadline_ms=deadline_ms)
