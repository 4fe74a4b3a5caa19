"""The escalation a settled result raises, published with it: an output of the Outbox.

Registered by the wiring (`worker/app.py`) as the first output of `worker/pipeline/outbox.py`,
so the escalation is on the bus before the result it belongs to (a crash in between
republishes both; the escalation's id makes the copy a server-side duplicate), and the
channel output after it can deliver the escalation too (`Owed.escalation`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from schemas.result import ResultStatus
from worker.bus.publisher import BusPublisher
from worker.escalation.build import escalation_for
from worker.metrics import Metrics
from worker.pipeline.outbox import Owed

log = logging.getLogger(__name__)


class EscalationOutput:
    """Publishes the escalation `worker/escalation/rules.py` makes of a settled result."""

    fault_point = "after_escalation"

    def __init__(
        self,
        publisher: BusPublisher,
        metrics: Metrics,
        *,
        approval_ttl_ms: int,
        risk_of: Callable[[str], str | None] | None = None,
    ) -> None:
        self.publisher = publisher
        self.metrics = metrics
        #: The risk of a capability id (the escalation's `risk`, aip-1.0-wire.md §7.7);
        #: None, or a capability it does not know: the escalation names no risk.
        self.risk_of = risk_of
        #: How long a paused run keeps its place (the operator timeout): the approval's TTL.
        self.approval_ttl_ms = approval_ttl_ms

    async def publish(self, owed: Owed) -> None:
        if not owed.failed and owed.status is not ResultStatus.REQUIRES_HUMAN:
            return  # what `rule_for` needs before any rule: no escalation, nothing decoded
        result, action = owed.result, owed.action
        escalation = escalation_for(result, action, approval_ttl_ms=self.approval_ttl_ms)
        if escalation is None:
            return
        risk = self.risk_of(escalation.capability) if self.risk_of is not None else None
        await self.publisher.escalation(escalation, risk=risk)
        owed.escalation = escalation
        if owed.republished:
            return
        self.metrics.escalation_raised(result.endpoint_id, escalation.kind.value)
        log.info(
            "escalation %s raised for %s (%s)",
            escalation.escalation_id,
            action.id,
            escalation.code.value if escalation.code else result.status.value,
            extra={"endpoint": result.endpoint_id, "action_id": action.id},
        )
