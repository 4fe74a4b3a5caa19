"""An Action whose retry policy was spent, dead-lettered beside its failed result: an output
of the Outbox.

When every attempt the read retry policy allows failed retryably (`worker/operations/
retry.py`), the Action still settles one failed, retryable result, and its Action also gets
one DLQ entry, as the AIP reference runtime keeps one: the signed `action_status` Envelope
in state `dead_lettered` every DLQ entry is (`worker/wire/dead_letters.py`), filed under the
Action's id, with the reference's `ActionStatus.retry` (`attempts`, the first included;
`policy`; `last_error`, the result's error as an AIP ProtocolError; `dead_letter_reason`),
its capability, `result_status: failed`, `completed_at` the settle's time, and the Action's
Envelope as stored on the actions stream in its facts (what `dlq replay` republishes under
a new id once Hermes answers again).

Exactly one entry, never lost: registered by the wiring (`worker/app.py`) as an output of
`worker/pipeline/outbox.py`, it is made from the stored result (its `retry_exhausted`
facts, signed with it), so a redelivery that republishes the result after a crash makes
the same entry, under the same id: `dlq_` + the first 32 hex of the sha256 of
`{results subject}:retry_exhausted`, also its `Nats-Msg-Id`, which JetStream stores once
(the DLQ's duplicate window is a day, `AIPD_STREAM_DLQ_DUPLICATE_WINDOW_S`, so a result
whose publication kept failing for minutes still makes one entry).
Nothing is written for a definitive failure, a deadline stop, or an unsafe operation: those
are never retried by the worker, so no policy was spent.

A DLQ stream at its limit refuses the entry (`dlq_dropped_total{reason="full"}`, one log
line): the result is published all the same, since a full DLQ must not hold answers back.
Unlike refusals, these entries pass no rate limit: each stands for an Action that ran.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import msgspec
from nats.aio.msg import Msg

from schemas.audit import ReceiptEvent
from schemas.result import ResultStatus
from worker.bus.audit import AuditLog
from worker.bus.dead_letters import header_safe
from worker.bus.publisher import BusPublisher
from worker.errors import StreamFull
from worker.metrics import Metrics
from worker.pipeline.outbox import Owed
from worker.wire.actions import timestamp_of_ms
from worker.wire.dead_letters import dead_letter_facts
from worker.wire.results import error_to_aip

log = logging.getLogger(__name__)

#: `ActionStatus.retry.dead_letter_reason` of every entry this output writes.
REASON = "retry_policy_exhausted"


def exhausted_dlq_id(results_subject: str) -> str:
    """The entry id of an Action whose retry policy was spent: the DLQ's own scheme
    (`dlq_` + 32 hex of a sha256 over where the Action is), seeded by its results subject,
    which names it alone, so every publication of its result names the same entry."""
    return "dlq_" + hashlib.sha256(f"{results_subject}:retry_exhausted".encode()).hexdigest()[:32]


class ExhaustionOutput:
    """Writes the DLQ entry of a settled result whose retry policy was spent."""

    fault_point = "after_exhaustion_dead_letter"

    def __init__(
        self, publisher: BusPublisher, audit: AuditLog, metrics: Metrics, *, keep_bytes: int
    ) -> None:
        self.publisher = publisher
        self.audit = audit
        self.metrics = metrics
        #: How much of the Action's Envelope the entry keeps (`AIPD_DLQ_KEEP_BYTES`).
        self.keep_bytes = keep_bytes

    async def publish(self, owed: Owed) -> None:
        if not owed.failed or owed.status is not ResultStatus.FAILED:
            return  # no error, or not failed: no retry policy was spent (nothing decoded)
        result = owed.result
        spent, error = result.retry_exhausted, result.error
        if (
            spent is None
            or error is None
            or result.status is not ResultStatus.FAILED
            or not error.retryable
        ):
            return
        endpoint_id, action_id = result.endpoint_id, result.action_id
        subjects = self.publisher.subjects
        msg = owed.message
        dlq_id = exhausted_dlq_id(subjects.results(endpoint_id, action_id))
        facts = dead_letter_facts(
            dlq_id=dlq_id,
            endpoint_id=endpoint_id,
            code=error.code,
            reason=header_safe(error.message),
            subject=msg.subject if msg is not None else subjects.actions(endpoint_id),
            stream_seq=_stream_seq(msg),
            worker_id=result.settled_by,
            payload=(msg.data or b"") if msg is not None else b"",
            keep_bytes=self.keep_bytes,
        )
        status: dict[str, Any] = {
            "capability_id": result.capability,
            "result_status": ResultStatus.FAILED.value,
            "completed_at": timestamp_of_ms(result.settled_at_unix_ms),
            "retry": {
                "attempts": spent.attempts,
                "policy": msgspec.to_builtins(spent.policy),
                "last_error": error_to_aip(error),
                "dead_letter_reason": REASON,
            },
        }
        try:
            ack = await self.publisher.dead_letter(facts, action_id=action_id, status=status)
        except StreamFull:
            if not owed.republished:
                self.metrics.exhausted_dead_lettered(endpoint_id, error.code.value, kept=False)
                log.warning(
                    "%s spent its retry policy; DLQ stream full, no entry written",
                    action_id,
                    extra={"endpoint": endpoint_id, "action_id": action_id},
                )
            return
        if owed.republished or ack.duplicate:
            return  # the entry the first publication wrote
        self.metrics.exhausted_dead_lettered(endpoint_id, error.code.value, kept=True)
        self.audit.emit(
            ReceiptEvent.DEAD_LETTERED,
            action_id=action_id,
            endpoint_id=endpoint_id,
            fence=result.fence,
            code=error.code.value,
            dlq_id=dlq_id,
            attempts=spent.attempts,
        )
        log.warning(
            "dead-lettered %s: %s after %d attempts (%s)",
            action_id,
            error.code.value,
            spent.attempts,
            dlq_id,
            extra={"endpoint": endpoint_id, "action_id": action_id},
        )


def _stream_seq(msg: Msg | None) -> int:
    """The Action's sequence in the actions stream; -1 when it has none."""
    try:
        return int(msg.metadata.sequence.stream) if msg is not None else -1
    except Exception:
        return -1
