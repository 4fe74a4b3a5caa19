"""Every answer a delivery gets without executing: DLQ, refusal, the stored result again, ack.

- `dead_letter`: an envelope that is not trusted or not readable (`Rejected`) is kept in
  the DLQ with its reason and `term()`ed; it touches no Action state.
- `refuse`: a trusted envelope that may not run is settled once as a failed result under
  its own lease and fence, with its one-chunk stream.
- `without_lease`: every acquire answer but "acquired": an id reused with another request
  (DLQ), a settled Action (its stored result again), one this worker already runs (joined),
  one another worker holds (nak until its lease expires).
- `republish`: a duplicate of a settled Action gets the stored result again (same Msg-Id)
  only when the stream lost it, then the ack.

Escalations and channel deliveries go out with a result, before it, here too.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from schemas.action import Action
from schemas.audit import ReceiptEvent
from schemas.codec import encode
from schemas.errors import ErrorCode
from schemas.escalation import Escalation
from schemas.ids import is_action_id
from schemas.result import ActionResult, ResultStatus
from worker.channel.egress import deliveries_for
from worker.chunk_stream import refusal_chunk
from worker.dead_letters import Kept
from worker.errors import Refusal, Rejected
from worker.escalation.build import escalation_for
from worker.execution import now_ms
from worker.metrics import DeliveryOutcome
from worker.pipeline.acquire import Acquire
from worker.pipeline.delivery import Delivery
from worker.pipeline.runtime import Runtime
from worker.store.lease_store import AcquireStatus, LeaseGrant, SettleStatus
from worker.trust.responses import sha256_hex

log = logging.getLogger(__name__)

_result_decoder = msgspec.json.Decoder(ActionResult)


class Answers:
    def __init__(self, rt: Runtime, acquire: Acquire) -> None:
        self.rt = rt
        self.acquire = acquire

    async def dead_letter(self, msg: Msg, endpoint_id: str, rejected: Rejected) -> None:
        """Keep the rejected envelope (its first bytes, size and sha256) with its reason,
        then `term()` it; over the DLQ rate or with the DLQ full it is only counted.

        An envelope that failed authentication may name any id (`claimed_action_id`), a
        victim's too: its receipt goes under the DLQ entry's own id (`Aip-Dlq-Id`), so
        nothing unauthenticated ever appends to an Action's chain. A refusal that was not
        kept gets no receipt either: a flood must not fill the audit stream instead.
        """
        rt = self.rt
        code, action_id, claimed = rejected.code, rejected.action_id, rejected.claimed_action_id
        seq = _stream_seq(msg)
        dlq_id = _dlq_id(msg.subject, seq)
        kept = await rt.dead_letters.write(
            endpoint_id,
            dlq_id=dlq_id,
            subject=msg.subject,
            stream_seq=seq,
            payload=msg.data,
            code=code,
            reason=rejected.reason,
        )
        if kept is Kept.WRITTEN:
            if action_id is not None:
                rt.audit.emit(
                    ReceiptEvent.DEAD_LETTERED,
                    action_id=action_id,
                    endpoint_id=endpoint_id,
                    code=code.value,
                    dlq_id=dlq_id,
                )
            elif claimed is not None:
                rt.audit.emit(
                    ReceiptEvent.DEAD_LETTERED,
                    action_id=dlq_id,
                    endpoint_id=endpoint_id,
                    code=code.value,
                    claimed_action_id=claimed if is_action_id(claimed) else None,
                )
            rt.metrics.dead_lettered(endpoint_id, code.value)
            log.warning(
                "dead-lettered %s seq %s: %s (%s)",
                msg.subject,
                seq,
                code.value,
                rejected.reason,
                extra={"endpoint": endpoint_id, "action_id": action_id},
            )
        await quiet(msg.term())

    async def refuse(self, delivery: Delivery, refusal: Refusal) -> None:
        """Settle a failed result for a trusted envelope that may not run (exactly once)."""
        rt = self.rt
        action, keys, endpoint_id = delivery.action, delivery.keys, delivery.endpoint_id
        error = refusal.error.to_protocol(endpoint_id=endpoint_id, read_only=refusal.read_only)
        rt.audit.emit(
            ReceiptEvent.REFUSED,
            action_id=action.id,
            endpoint_id=endpoint_id,
            code=error.code.value,
        )
        owner, grant = await self.acquire(delivery, to_execute=False)
        if not await self.without_lease(delivery, grant):
            return
        settled_at = now_ms()
        chunk = refusal_chunk(action.id, endpoint_id, error, settled_at)
        result = ActionResult(
            action_id=action.id,
            capability=action.capability,
            endpoint_id=endpoint_id,
            status=ResultStatus.FAILED,
            error=error,
            settled_by=rt.worker_id,
            fence=grant.fence,
            settled_at_unix_ms=settled_at,
            last_chunk_sha256=sha256_hex(encode(chunk)),
            action_sha256=sha256_hex(delivery.msg.data),
        )
        result_bytes = encode(result)
        stored = await rt.stores.leases.settle(keys, owner, grant.fence, result_bytes)
        if stored.status is SettleStatus.FENCED_OUT:
            return
        payload = stored.stored or result_bytes
        stored_result = decoded_result(stored.stored) or result
        if stored.stored is not None and stored_result.error is not None:
            # An earlier refusal's result: its chunk is a function of it, rebuilt exactly.
            chunk = refusal_chunk(
                action.id, endpoint_id, stored_result.error, stored_result.settled_at_unix_ms
            )
        escalation = await self.escalate(stored_result, action)
        await self.channel_out(stored_result, action, escalation)
        # Like every Action, a refused one ends its chunk stream before its result, so a
        # consumer following the chunks learns the outcome too.
        await rt.publisher.chunk_awaited(chunk)
        await rt.publisher.result_bytes(endpoint_id, action.id, payload)
        rt.metrics.delivery(endpoint_id, DeliveryOutcome.REFUSED)
        rt.metrics.settled(action.capability, ResultStatus.FAILED.value, error.code.value)
        await self.ack_all([delivery.msg])

    async def without_lease(self, delivery: Delivery, grant: LeaseGrant) -> bool:
        """Answer every acquire answer but ACQUIRED; True means: go on and execute."""
        rt = self.rt
        msg, action, endpoint_id = delivery.msg, delivery.action, delivery.endpoint_id
        if grant.status is AcquireStatus.ACQUIRED:
            return True
        if grant.status is AcquireStatus.COLLISION:
            operation = delivery.operation
            code = (
                operation.collision_code
                if operation is not None
                else ErrorCode.CONFIGURATION_OR_INPUT
            )
            await self.dead_letter(
                msg,
                endpoint_id,
                Rejected(
                    code,
                    "idempotency collision: this Action id was first used with a different "
                    "request",
                    action_id=action.id,
                ),
            )
            return False
        if grant.status is AcquireStatus.SETTLED:
            rt.metrics.delivery(endpoint_id, DeliveryOutcome.REPUBLISHED)
            stored = await rt.stores.leases.get_result(delivery.keys)
            await self.republish([msg], action.id, endpoint_id, stored, action=action)
            return False
        holder = rt.keeper.holding(action.id)
        if holder is not None:
            rt.metrics.delivery(endpoint_id, DeliveryOutcome.JOINED)
            # A redelivery of an Action this very worker is running: keep the newest handle
            # alive too, and ack it with the rest when the Action settles.
            holder.messages.append(msg)
            return False
        rt.audit.emit(
            ReceiptEvent.DUPLICATE,
            action_id=action.id,
            endpoint_id=endpoint_id,
            fence=grant.fence,
            holder=grant.other_owner,
        )
        rt.metrics.delivery(endpoint_id, DeliveryOutcome.DUPLICATE)
        wait_ms = max(50, min(grant.expires_at_ms - now_ms() + 50, rt.settings.lease_ttl_ms))
        await self.nak(msg, wait_ms / 1000)
        return False

    async def republish(
        self,
        msgs: list[Msg],
        action_id: str,
        endpoint_id: str,
        stored: bytes | None,
        *,
        action: Action | None = None,
    ) -> None:
        """A duplicate of a settled Action: the stored result again (same Msg-Id), then ack."""
        if stored is None:
            # The result expired between the two reads; the lease still remembers the Action.
            for msg in msgs:
                await self.nak(msg)
            return
        if not await self.result_on_stream(endpoint_id, action_id):
            # Only when it is missing (a crash between settle and publish, or expired): a
            # republish after the duplicate window would otherwise store a second copy.
            # The escalation went out before the result, so it may be missing too: the same
            # one again (same id, a server-side duplicate if the first one was stored).
            stored_result = decoded_result(stored)
            if action is not None and stored_result is not None:
                escalation = await self.escalate(stored_result, action, republished=True)
                await self.channel_out(stored_result, action, escalation)
            await self.rt.publisher.result_bytes(endpoint_id, action_id, stored)
            self.rt.audit.emit(
                ReceiptEvent.REPUBLISHED, action_id=action_id, endpoint_id=endpoint_id
            )
        await self.ack_all(msgs)

    async def escalate(
        self, result: ActionResult, action: Action, *, republished: bool = False
    ) -> Escalation | None:
        """Publish the escalation `result` raises, if any (worker/escalation/rules.py).

        Called only after this worker's own fenced settle, or when a stored result is
        republished: a stale owner, refused by the fence, never gets here.
        """
        escalation = escalation_for(
            result, action, approval_ttl_ms=self.rt.settings.hermes_operator_timeout_ms
        )
        if escalation is None:
            return None
        await self.rt.publisher.escalation(escalation)
        if republished:
            return escalation
        self.rt.metrics.escalation_raised(result.endpoint_id, escalation.kind.value)
        log.info(
            "escalation %s raised for %s (%s)",
            escalation.escalation_id,
            action.id,
            escalation.code.value if escalation.code else result.status.value,
            extra={"endpoint": result.endpoint_id, "action_id": action.id},
        )
        return escalation

    async def channel_out(
        self, result: ActionResult, action: Action, escalation: Escalation | None
    ) -> None:
        """Queue the channel deliveries the egress rules make of this result (and its
        escalation), before the result is published (docs/channels.md)."""
        if self.rt.channel is None:
            return
        for delivery in deliveries_for(self.rt.channel, result, action, escalation):
            await self.rt.publisher.channel_delivery(delivery)

    async def result_on_stream(self, endpoint_id: str, action_id: str) -> bool:
        subjects = self.rt.subjects
        try:
            await self.rt.js.get_last_msg(
                subjects.stream_name("results"), subjects.results(endpoint_id, action_id)
            )
        except NotFoundError:
            return False
        return True

    async def ack_all(self, msgs: list[Msg]) -> None:
        for msg in msgs:
            try:
                await msg.ack_sync(timeout=5.0)
            except Exception:
                log.info("ack not confirmed; a redelivery will republish the stored result")

    async def nak(self, msg: Msg, delay_s: float | None = None) -> None:
        """Redeliver `msg` after `delay_s` (default: the configured nak delay)."""
        if delay_s is None:
            delay_s = self.rt.settings.nak_delay_ms / 1000
        await quiet(msg.nak(delay=delay_s))


def decoded_result(stored: bytes | None) -> ActionResult | None:
    if stored is None:
        return None
    try:
        return _result_decoder.decode(stored)
    except msgspec.DecodeError:
        return None


def _dlq_id(subject: str, seq: int) -> str:
    """The DLQ entry's id: derived from where the envelope was stored, so a second attempt
    to dead-letter the same delivery names the same entry (and the server drops the copy)."""
    if seq == 0:
        return "dlq_" + secrets.token_hex(16)
    return "dlq_" + hashlib.sha256(f"{subject}:{seq}".encode()).hexdigest()[:32]


def _stream_seq(msg: Msg) -> int:
    try:
        return int(msg.metadata.sequence.stream)
    except Exception:
        return 0


async def quiet(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception:
        log.debug("jetstream ack/nak failed", exc_info=True)
