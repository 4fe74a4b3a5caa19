"""One delivery, start to finish (docs/architecture.md §4): decode, trust, lease, execute,
settle, ack — the order is the guarantee.

Nothing reaches Hermes before the envelope is decoded, trusted and leased; nothing is
published as a result before the fenced settle wrote it; nothing is acked before the result
is durable on JetStream. JetStream acks are cleanup, never authority: a worker that lost
its lease stops without writing, publishing or acking, and the fence in Redis rejects
anything it might still try.

A `Pipeline` runs one consumer's messages through its `Intake` (an Action, a delegation,
a channel delivery: `open`, then the intake's steps in order, passing one frozen
`Delivery`), then the leased path every intake shares (`worker.pipeline.execute`). A step
that ends the delivery early gets its answer from `worker.pipeline.answers`.
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg

from schemas.errors import ErrorCode
from worker import tracing
from worker.errors import (
    PublishFailed,
    Refusal,
    Rejected,
    StoreNotAccepting,
    StoreUnavailable,
)
from worker.metrics import DeliveryOutcome
from worker.operations.base import RECOVERY_BUDGET_MS, Recovering
from worker.pipeline.acquire import Acquire
from worker.pipeline.answers import Answers
from worker.pipeline.delivery import Delivery, Intake, is_dependency_failure
from worker.pipeline.execute import Leased
from worker.pipeline.runtime import Runtime
from worker.pipeline.steps import deadline_of
from worker.store.clock import now_ms

log = logging.getLogger(__name__)


class Pipeline:
    def __init__(self, rt: Runtime, intake: Intake) -> None:
        self.rt = rt
        self.intake = intake
        self.acquire = Acquire(rt)
        self.answers = Answers(rt, self.acquire)
        self.leased = Leased(rt, self.acquire, self.answers)

    async def handle(self, msg: Msg, endpoint_id: str) -> None:
        """Never raises: bad input or a failing dependency must not stop the consumer loop.

        A failing dependency naks the message, which comes back after the nak delay. Any
        other failure before the lease was caused by this envelope and would recur on every
        redelivery to every worker (a poison message, nak'd forever): it is dead-lettered
        once with `connector_host.execution` instead.
        """
        with tracing.consuming(msg) as current:
            await self._handle(msg, endpoint_id, current)

    async def _handle(self, msg: Msg, endpoint_id: str, current: tracing.Span | None) -> None:
        rt = self.rt
        try:
            await self._through(msg, endpoint_id)
        except StoreUnavailable as exc:
            tracing.failed(current, type(exc).__name__)
            # The store is failing or full: a known dependency failure, so no traceback and
            # no DLQ. Before a lease it is certain (nothing was leased); the nak lets a worker
            # whose store answers take the message.
            cause = "not accepting" if isinstance(exc, StoreNotAccepting) else "unavailable"
            rt.errors.report(
                "delivery.store", cause, log,
                "redis %s on %s (%s); redelivering later", cause, endpoint_id, exc,
                extra={"endpoint": endpoint_id},
            )
            rt.metrics.delivery(endpoint_id, DeliveryOutcome.DEFERRED)
            await self.answers.nak(msg)
        except PublishFailed as exc:
            tracing.failed(current, type(exc).__name__)
            # JetStream refused or left unanswered what a settled Action owes the bus (a
            # full store): the result waits in Redis, and the redelivery republishes it
            # (worker/pipeline/outbox.py). A known dependency failure: no traceback.
            rt.errors.report(
                "delivery.bus", type(exc).__name__, log,
                "jetstream did not store a publication on %s (%s); redelivering later",
                endpoint_id, exc, extra={"endpoint": endpoint_id},
            )
            rt.metrics.delivery(endpoint_id, DeliveryOutcome.DEFERRED)
            await self.answers.nak(msg)
        except Exception as exc:
            tracing.failed(current, type(exc).__name__)
            rt.metrics.delivery(endpoint_id, DeliveryOutcome.ERROR)
            if not self.acquire.reached(msg) and not is_dependency_failure(exc):
                rt.errors.report(
                    "delivery.before_lease", type(exc).__name__, log,
                    "delivery failed before its lease on %s; dead-lettering it", endpoint_id,
                    level=logging.ERROR, exc_info=True, extra={"endpoint": endpoint_id},
                )
                try:
                    await self.answers.dead_letter(
                        msg,
                        endpoint_id,
                        Rejected(
                            ErrorCode.HOST_EXECUTION,
                            f"failed before the lease: {type(exc).__name__}",
                        ),
                    )
                    return
                except Exception:
                    log.warning("could not dead-letter the delivery; redelivering it later")
            else:
                # Logged once per exception class per interval: a failing dependency fails
                # every delivery alike (37 MB of tracebacks per worker in 100 s, before).
                rt.errors.report(
                    "delivery", type(exc).__name__, log,
                    "delivery failed unexpectedly on %s; redelivering later", endpoint_id,
                    level=logging.ERROR, exc_info=True, extra={"endpoint": endpoint_id},
                )
            await self.answers.nak(msg)
        finally:
            self.acquire.forget(msg)

    async def _through(self, msg: Msg, endpoint_id: str) -> None:
        with tracing.span("aip.admission") as admission:
            try:
                delivery = await self.intake.open(msg, endpoint_id)
            except Rejected as rejected:
                tracing.failed(admission, rejected.code.value)
                await self.answers.dead_letter(msg, endpoint_id, rejected)
                return
            for step in self.intake.steps:
                try:
                    delivery = await step(delivery)
                except Refusal as refusal:
                    tracing.failed(admission, refusal.error.code.value)
                    self.intake.refused(delivery, refusal)
                    refused = refusal
                    break
            else:
                refused = None
        if refused is not None:
            await self.recover_or_refuse(delivery, refused)
            return
        await self.leased.run(delivery)

    async def recover_or_refuse(self, delivery: Delivery, refusal: Refusal) -> None:
        """Settle the refusal, unless an earlier delivery already began this work: then the
        refusal forbids only a new start, and what exists is observed, stopped or settled
        on the leased path, within at least the recovery budget."""
        operation = delivery.operation
        if (
            delivery.may_recover
            and operation is not None
            and await operation.began(self.rt.stores, delivery.keys)
        ):
            deadline_ms = max(
                now_ms() + RECOVERY_BUDGET_MS, deadline_of(delivery.action, operation.spec)
            )
            recovering = delivery.having(
                params=Recovering(delivery.params, refusal.error),
                trusted={},
                deadline_ms=deadline_ms,
            )
            await self.leased.run(recovering)
            return
        await self.answers.refuse(delivery, refusal)
