"""Steps 6-8 of docs/architecture.md §4: the fenced settle, then publication, then the ack.

The result is written only if this owner's fence still holds (write-once), with the
terminal chunk that closes the Action's stream beside it (and the chunks the bus refused
on the way, `ChunkStream.owed`), measured first against what one
bus message may carry; then the `Outbox` (`worker/pipeline/outbox.py`) publishes what the
settled Action owes the bus and acks the delivery.

Only a streaming capability (`OperationSpec.streaming`, the manifest's
`supports_streaming`) has a chunk stream. The result of any other capability is the whole
answer, as upstream's connector gives it: no terminal chunk, and the signed result names no
last chunk (`last_chunk_sha256` absent), its `output` carrying what the one data chunk used
to (aip-1.0-wire.md §7.3).
"""

from __future__ import annotations

import logging

import msgspec

from schemas.audit import ReceiptEvent
from schemas.chunk import ChunkKind
from schemas.errors import ErrorCode, ProtocolError
from schemas.result import ActionResult, ResultStatus
from worker import faults
from worker.errors import ConnectorError
from worker.execution.chunk_stream import ChunkStream
from worker.execution.context import Execution
from worker.metrics import FenceStep
from worker.operations.base import Outcome
from worker.pipeline.answers import Answers
from worker.pipeline.outbox import Settled, decoded_result
from worker.pipeline.runtime import Runtime
from worker.store.clock import now_ms
from worker.store.lease_store import SettleStatus
from worker.trust.responses import sha256_hex
from worker.wire.results import as_sent, encode_result

log = logging.getLogger(__name__)


class Settle:
    def __init__(self, rt: Runtime, answers: Answers) -> None:
        self.rt = rt
        self.answers = answers

    async def __call__(self, execution: Execution, outcome: Outcome) -> None:
        """Settle `outcome`, publish it and ack; raises LeaseLost when fenced out."""
        rt = self.rt
        action = execution.action
        endpoint_id = execution.endpoint.id
        read_only = execution.operation.spec.read_only
        error: ProtocolError | None = None
        if outcome.error is not None:
            error = as_sent(outcome.error.to_protocol(endpoint_id=endpoint_id, read_only=read_only))
        streams = execution.operation.spec.streaming
        terminal = (
            execution.chunks.closing(
                ChunkKind.ERROR if outcome.status is ResultStatus.FAILED else ChunkKind.DONE,
                {"status": outcome.status.value, "error": msgspec.to_builtins(error)},
            )
            if streams
            else None
        )
        terminal_bytes = execution.chunks.encode(terminal) if terminal is not None else None
        signer = rt.publisher.signer
        aip_signer = signer.aip if signer is not None else None
        result = ActionResult(
            action_id=action.id,
            capability=action.capability,
            endpoint_id=endpoint_id,
            status=outcome.status,
            output=outcome.output,
            error=error,
            settled_by=rt.worker_id,
            fence=execution.fence,
            settled_at_unix_ms=now_ms(),
            last_chunk_sha256=sha256_hex(terminal_bytes) if terminal_bytes is not None else None,
            action_sha256=sha256_hex(execution.messages[0].data),
            retry_exhausted=outcome.error.retry_exhausted if outcome.error is not None else None,
        )
        # Sealed (and signed) once, here: Redis keeps the Envelope, and every publication
        # of this result, a republish after a crash too, sends these very bytes.
        payload = encode_result(result, action=action, signer=aip_signer, endpoint_id=endpoint_id)
        oversize = self.oversize(payload, terminal_bytes)
        if oversize is not None:
            # Measured before anything is stored: a result no bus message can carry would
            # be settled, never published, and redelivered forever.
            error = as_sent(oversize.to_protocol(endpoint_id=endpoint_id, read_only=read_only))
            if terminal is not None:
                terminal = ChunkStream.replaced(
                    terminal,
                    {"status": ResultStatus.FAILED.value, "error": msgspec.to_builtins(error)},
                )
                terminal_bytes = execution.chunks.encode(terminal)
            result = msgspec.structs.replace(
                result,
                status=ResultStatus.FAILED,
                output=None,
                error=error,
                last_chunk_sha256=(
                    sha256_hex(terminal_bytes) if terminal_bytes is not None else None
                ),
                retry_exhausted=None,
            )
            payload = encode_result(
                result, action=action, signer=aip_signer, endpoint_id=endpoint_id
            )
        lease = execution.lease
        lease.check()
        lease.ending = True
        owed = execution.chunks.owed
        stored = await rt.stores.leases.settle(
            lease.keys, lease.owner, lease.fence, payload, terminal_bytes, owed
        )
        if stored.status is SettleStatus.FENCED_OUT:
            rt.metrics.fenced_out(endpoint_id, FenceStep.SETTLE)
            rt.audit.emit(
                ReceiptEvent.FENCED_OUT,
                action_id=action.id,
                endpoint_id=endpoint_id,
                fence=lease.fence,
            )
            raise lease.lose("settle refused: a newer owner holds the lease")
        outbox = self.answers.outbox
        if stored.status is SettleStatus.EXISTS and not _is_own(stored.stored, execution):
            # Lost to an owner that settled first: its result is the answer, republished.
            rt.keeper.lose(execution, "another owner settled this Action first", cancel=False)
            assert stored.stored is not None
            await outbox.republish(
                execution.messages, action, endpoint_id,
                Settled(stored.stored, stored.terminal, stored.owed),
            )
            return
        rt.audit.emit(
            ReceiptEvent.SETTLED,
            action_id=action.id,
            endpoint_id=endpoint_id,
            fence=lease.fence,
            status=outcome.status.value,
            code=error.code.value if error else None,
        )
        log.info(
            "settled %s %s%s",
            action.id,
            outcome.status.value,
            f" ({error.code.value})" if error else "",
            extra=execution.log_fields(),
        )
        rt.metrics.settled(
            action.capability, outcome.status.value, error.code.value if error else None,
            uncertain=bool(error and error.uncertain_outcome),
        )
        faults.hit("after_settle", action.id)
        await outbox.publish(
            execution.messages,
            action,
            endpoint_id,
            Settled(payload, terminal_bytes, owed or None, terminal_chunk=terminal),
            status=result.status,
            failed=result.error is not None,
        )

    def oversize(self, payload: bytes, terminal: bytes | None) -> ConnectorError | None:
        """`stream_publication` when the encoded result, or the terminal chunk (which may
        carry a provider's terminal event), is larger than one bus message may be."""
        limit = self.rt.publisher.max_message_bytes()
        size, what = len(payload), "result"
        if size <= limit and terminal is not None:
            size, what = len(terminal), "terminal chunk"
        if size <= limit:
            return None
        return ConnectorError(
            ErrorCode.STREAM_PUBLICATION,
            f"the provider's answer makes a {size}-byte {what}, over the {limit} bytes one "
            "bus message may carry (NATS max_payload); it was not stored or published",
        )


def _is_own(stored: bytes | None, execution: Execution) -> bool:
    """True when the stored result is this execution's own write (its reply was lost)."""
    result = decoded_result(stored)
    return (
        result is not None
        and result.fence == execution.fence
        and result.settled_by == execution.worker_id
    )
