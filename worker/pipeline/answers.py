"""Every answer a delivery gets without executing: DLQ, refusal, the stored result again, ack.

- `dead_letter`: an envelope that is not trusted or not readable (`Rejected`) is kept in
  the DLQ with its reason and `term()`ed; it touches no Action state.
- `refuse`: a trusted envelope that may not run is settled once as a failed result under
  its own lease and fence, with its one-chunk stream when its capability streams (a
  non-streaming capability has no chunk stream, `worker.pipeline.settle`); unless the bus
  already holds the result of this exact envelope (`Outbox.envelope_answered`): then
  nothing is published. A refusal nothing was attempted for is settled `refused`: a later
  envelope with another request under the id clears it and takes the id
  (`lua/lease_acquire.lua`), so refusing a forgery first never uses the id up for the
  genuine envelope; a redelivery of the refused envelope itself meets its stored refusal.
- `replay`: an Action whose idempotency key another Action holds gets that Action's result
  (`worker.pipeline.idempotency`), settled under its own lease like a refusal (with its
  one-chunk stream when its capability streams).
- `without_lease`: every acquire answer but "acquired": an id reused with another request
  (DLQ), a settled Action (its stored result again), one this worker already runs (joined),
  one another worker holds (nak until its lease expires).

What a settled Action owes the bus (its outputs, terminal chunk and result) and the ack
that follows are published by the one `Outbox` (`worker/pipeline/outbox.py`), here as after
an execution.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from typing import Any

from nats.aio.msg import Msg

from schemas.audit import ReceiptEvent
from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.ids import is_action_id
from schemas.result import ActionResult, ResultStatus
from worker.bus.dead_letters import Kept
from worker.errors import Refusal, Rejected, attempted_before
from worker.execution.chunk_stream import refusal_chunk, refusal_start, replay_chunk
from worker.metrics import DeliveryOutcome
from worker.pipeline.acquire import Acquire
from worker.pipeline.delivery import Delivery
from worker.pipeline.outbox import Outbox, Settled
from worker.pipeline.runtime import Runtime
from worker.store.clock import now_ms
from worker.store.lease_store import AcquireStatus, LeaseGrant, SettleStatus
from worker.trust.responses import sha256_hex
from worker.wire.chunks import encode_chunk
from worker.wire.results import as_sent, decode_result, encode_result

log = logging.getLogger(__name__)


class Answers:
    def __init__(self, rt: Runtime, acquire: Acquire) -> None:
        self.rt = rt
        self.acquire = acquire
        self.outbox = Outbox(
            publisher=rt.publisher,
            subjects=rt.subjects,
            audit=rt.audit,
            metrics=rt.metrics,
            outputs=rt.outputs,
        )

    async def dead_letter(self, msg: Msg, endpoint_id: str, rejected: Rejected) -> None:
        """Keep the rejected envelope (its first bytes, size and sha256) with its reason,
        then `term()` it; over the DLQ rate or with the DLQ full it is only counted.

        An envelope that failed authentication may name any id (`claimed_action_id`), a
        victim's too: its receipt and its entry's `action_id` are the DLQ entry's own id
        (`dlq_…`), so nothing unauthenticated ever appends to an Action's chain. A refusal
        that was not kept gets no receipt either: a flood must not fill the audit stream
        instead.
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
            action_id=action_id,
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
        """Settle a failed result for a trusted envelope that may not run (exactly once).

        A refusal never sends anything to Hermes, but an earlier delivery of the same Action
        may have: when the lease records an unsafe attempt (`attempted_fence`), the refusal
        is settled as that attempt's unknown outcome instead, so nothing that may have
        reached Hermes is ever answered as a certain failure a publisher could retry.
        """
        rt = self.rt
        action, endpoint_id = delivery.action, delivery.endpoint_id
        if await self.outbox.envelope_answered(endpoint_id, action.id, delivery.msg.data):
            # This very envelope already has its result on the bus (a replay, or a
            # redelivery, after its Redis state expired): a second, failed, result would
            # contradict it. Nothing is published; the message is acked.
            rt.metrics.delivery(endpoint_id, DeliveryOutcome.ANSWERED)
            log.info(
                "refused %s (%s), whose result is already on the bus: nothing published",
                action.id,
                refusal.error.code.value,
                extra={"endpoint": endpoint_id, "action_id": action.id},
            )
            await self.outbox.ack_all([delivery.msg])
            return
        owner, grant = await self.acquire(delivery, to_execute=False)
        cause = refusal.error
        if grant.attempted_fence:
            cause = attempted_before(refused=refusal.error.code)
        error = as_sent(cause.to_protocol(endpoint_id=endpoint_id, read_only=refusal.read_only))
        rt.audit.emit(
            ReceiptEvent.REFUSED,
            action_id=action.id,
            endpoint_id=endpoint_id,
            code=error.code.value,
        )
        if not await self.without_lease(delivery, grant):
            return
        settled_at = now_ms()
        chunk: bytes | None = None
        if _streams(delivery):
            start = await refusal_start(
                rt.publisher, rt.stores.leases, delivery.keys,
                fence=grant.fence, action_id=action.id, endpoint_id=endpoint_id,
            )  # fmt: skip
            chunk = encode_chunk(
                refusal_chunk(action.id, endpoint_id, error, settled_at, start=start)
            )
        # Settled as a plain refusal (nothing attempted): another request under the id may
        # still take it (a forgery refused first does not burn an approved id, issue 24);
        # an uncertain one, after an earlier attempt, stands for good.
        if await self._settle(
            delivery,
            owner,
            grant.fence,
            chunk,
            settled_at,
            refused=not grant.attempted_fence,
            status=ResultStatus.FAILED,
            error=error,
        ):
            rt.metrics.delivery(endpoint_id, DeliveryOutcome.REFUSED)
            rt.metrics.settled(action.capability, ResultStatus.FAILED.value, error.code.value)

    async def replay(self, delivery: Delivery, original: bytes, original_action_id: str) -> None:
        """Answer an Action with the result of the Action that holds its idempotency key
        (`worker.pipeline.idempotency`), settled under its own lease and fence with its own
        one-chunk stream: the original's status, output and error, naming the original in
        `original_action_id`. Nothing is sent to Hermes."""
        rt = self.rt
        action, endpoint_id = delivery.action, delivery.endpoint_id
        try:
            first, _ = decode_result(original)
        except EnvelopeRejected:
            # Not an Envelope this worker reads (stored by another version): nothing is
            # settled or sent to Hermes; the delivery is redelivered later.
            log.warning("stored result of %s does not decode; replay deferred", original_action_id)
            await self.nak(delivery.msg)
            return
        owner, grant = await self.acquire(delivery, to_execute=False)
        if not await self.without_lease(delivery, grant):
            return
        # A holder answered with an earlier holder's result names that one: the Action
        # that ran.
        original_action_id = first.original_action_id or original_action_id
        settled_at = now_ms()
        chunk: bytes | None = None
        if _streams(delivery):
            chunk = encode_chunk(
                replay_chunk(
                    action.id, endpoint_id, first.status, first.error, original_action_id,
                    settled_at,
                )
            )  # fmt: skip
        if await self._settle(
            delivery,
            owner,
            grant.fence,
            chunk,
            settled_at,
            refused=False,
            status=first.status,
            output=first.output,
            error=first.error,
            original_action_id=original_action_id,
        ):
            rt.metrics.delivery(endpoint_id, DeliveryOutcome.REPLAYED)

    async def _settle(
        self,
        delivery: Delivery,
        owner: str,
        fence: int,
        chunk: bytes | None,
        settled_at: int,
        *,
        refused: bool,
        **outcome: Any,
    ) -> bool:
        """Settle an answer made without executing (its result, made of `outcome`'s status,
        output, error…, and its one-chunk stream, `chunk`, None for a capability that does
        not stream), then publish it; True when this call
        settled it. An answer an earlier delivery stored stands, published again only if
        the bus lacks it."""
        action, endpoint_id = delivery.action, delivery.endpoint_id
        result = ActionResult(
            action_id=action.id,
            capability=action.capability,
            endpoint_id=endpoint_id,
            settled_by=self.rt.worker_id,
            fence=fence,
            settled_at_unix_ms=settled_at,
            last_chunk_sha256=sha256_hex(chunk) if chunk is not None else None,
            action_sha256=sha256_hex(delivery.msg.data),
            **outcome,
        )
        signer = self.rt.publisher.signer
        result_bytes = encode_result(
            result,
            action=action,
            signer=signer.aip if signer is not None else None,
            endpoint_id=endpoint_id,
        )
        stored = await self.rt.stores.leases.settle(
            delivery.keys, owner, fence, result_bytes, chunk, refused=refused
        )
        if stored.status is SettleStatus.FENCED_OUT:
            return False
        if stored.status is SettleStatus.EXISTS:
            assert stored.stored is not None
            await self.outbox.republish(
                [delivery.msg], action, endpoint_id,
                Settled(stored.stored, stored.terminal, stored.owed),
            )
            return False
        # Like every Action of a streaming capability, one answered without running ends
        # its chunk stream before its result, so a consumer following the chunks learns the
        # outcome too.
        await self.outbox.publish(
            [delivery.msg],
            action,
            endpoint_id,
            Settled(result_bytes, chunk),
            status=result.status,
            failed=result.error is not None,
        )
        return True

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
            stored, terminal, owed = await rt.stores.leases.get_settled(delivery.keys)
            if stored is None:
                # The result expired between the two reads; the lease still remembers it.
                await self.nak(msg)
                return False
            await self.outbox.republish([msg], action, endpoint_id, Settled(stored, terminal, owed))
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

    async def ack_all(self, msgs: list[Msg]) -> None:
        await self.outbox.ack_all(msgs)

    async def nak(self, msg: Msg, delay_s: float | None = None) -> None:
        """Redeliver `msg` after `delay_s` (default: the configured nak delay)."""
        if delay_s is None:
            delay_s = self.rt.settings.nak_delay_ms / 1000
        await quiet(msg.nak(delay=delay_s))


def _streams(delivery: Delivery) -> bool:
    """Whether the Action's capability has a chunk stream (one this worker publishes, and
    streaming): only then does an answer made without executing close it with a chunk."""
    operation = delivery.operation
    return operation is not None and operation.spec.streaming


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
