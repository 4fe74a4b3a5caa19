"""Steps 4-5 of docs/architecture.md §4: the lease, then the operation under it.

`Leased.run` first lets an Action with an idempotency key claim it
(`worker.pipeline.idempotency`: the key's holder runs, a later Action gets its result),
then acquires the lease (any other answer is given by `Answers.without_lease`),
opens the Action's chunk stream where it stands, runs the operation inside an `Execution`
while the heartbeat renews the lease, and hands the outcome to the settle. A lost lease,
found wherever it is found, arrives here as one `LeaseLost`: nothing is settled,
published or acked, and the loss is reported once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from schemas.action import Action
from schemas.audit import ReceiptEvent
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker import faults, tracing
from worker.bus.audit import ReceiptScope, enter_scope
from worker.errors import (
    ConnectorError,
    LeaseLost,
    attempted_before,
    deadline_exceeded,
    unexpected_failure,
)
from worker.execution.chunk_stream import ChunkStream
from worker.execution.context import Execution
from worker.execution.leases import HeldLease
from worker.metrics import DeliveryOutcome
from worker.operations.base import Operation, Outcome
from worker.pipeline.acquire import Acquire, subject_of
from worker.pipeline.answers import Answers, quiet
from worker.pipeline.delivery import Delivery, is_dependency_failure
from worker.pipeline.idempotency import Idempotency
from worker.pipeline.runtime import Runtime
from worker.pipeline.settle import Settle
from worker.store.lease_store import LeaseGrant

log = logging.getLogger(__name__)


class Leased:
    def __init__(self, rt: Runtime, acquire: Acquire, answers: Answers) -> None:
        self.rt = rt
        self.acquire = acquire
        self.answers = answers
        self.settle = Settle(rt, answers)
        self.idempotency = Idempotency(rt, acquire, answers)

    async def run(self, delivery: Delivery) -> None:
        rt = self.rt
        ep, operation = delivery.ep, delivery.operation
        assert ep is not None
        assert operation is not None
        action, endpoint_id = delivery.action, ep.endpoint.id
        if action.idempotency_key is not None and not await self.idempotency.admit(delivery):
            return
        with tracing.span("aip.lease"):
            owner, grant = await self.acquire(delivery)
        if not await self.answers.without_lease(delivery, grant):
            return
        cancel_requested = grant.cancel_requested
        if grant.cancel_pending:
            cancel_requested = await self.authorize_pending_cancels(delivery)
        rt.metrics.delivery(endpoint_id, DeliveryOutcome.EXECUTED)
        if grant.is_takeover:
            rt.metrics.takeover(endpoint_id)
        faults.hit("after_lease", action.id)
        lease = HeldLease(delivery.keys, owner, grant, ttl_ms=rt.settings.lease_ttl_ms)
        chunks = await ChunkStream.open(
            rt.publisher, lease, action_id=action.id, endpoint_id=endpoint_id,
            metrics=rt.metrics, leases=rt.stores.leases,
            operator=operation.spec.name == "operator",
        )
        execution = Execution(
            action=action,
            endpoint=ep.endpoint,
            operation=operation,
            hermes=ep.hermes,
            lease=lease,
            chunks=chunks,
            worker_id=rt.worker_id,
            deadline_ms=delivery.deadline_ms,
            stores=rt.stores,
            msg=delivery.msg,
            trusted_headers=delivery.trusted,
            cancel_requested=cancel_requested,
            metrics=rt.metrics,
        )
        rt.audit.emit(
            ReceiptEvent.LEASE_ACQUIRED,
            action_id=action.id,
            endpoint_id=endpoint_id,
            fence=grant.fence,
            takeover=grant.is_takeover,
            previous_owner=grant.other_owner or None,
        )
        rt.keeper.add(execution)
        try:
            with rt.metrics.executing(endpoint_id):
                with tracing.span(
                    f"aip.execute {operation.spec.name}",
                    attributes=_execute_attributes(action, endpoint_id, operation, grant)
                    if tracing.enabled()
                    else None,
                    # A takeover links to the delivery it took over from (its own trace
                    # continues the publisher's, like every delivery of the message).
                    links_to=({tracing.TRACEPARENT: grant.previous_trace},)
                    if grant.previous_trace
                    else (),
                ) as span:
                    outcome = await self.execute(execution, delivery.params)
                    if span is not None and outcome.error is not None:
                        tracing.failed(span, outcome.error.code.value)
                with tracing.span("aip.settle"):
                    await self.settle(execution, outcome)
        except LeaseLost as lost:
            # Whoever found it: nothing settled, nothing published, nothing acked.
            rt.keeper.lose(execution, str(lost), cancel=False)
        finally:
            rt.keeper.remove(execution)

    async def authorize_pending_cancels(self, delivery: Delivery) -> bool:
        """Cancels recorded before any worker knew this Action: the first whose requester
        may cancel it becomes its durable intent, the others are dropped (and audited).
        True when the Action now has a durable cancel intent."""
        rt = self.rt
        authorized: bytes | None = None
        subject = subject_of(delivery.action)
        for requested_by, intent in (await rt.stores.leases.pending_cancels(delivery.keys)).items():
            try:
                await rt.gate.authorize_cancel(
                    requested_by=requested_by, subject=subject, stores=rt.stores
                )
            except ConnectorError as exc:
                rt.audit.emit(
                    ReceiptEvent.CANCEL_REFUSED,
                    action_id=delivery.action.id,
                    endpoint_id=delivery.endpoint_id,
                    requested_by=requested_by,
                    code=exc.code.value,
                )
                continue
            authorized = authorized or intent
        return await rt.stores.leases.promote_cancel(delivery.keys, authorized)

    async def execute(self, execution: Execution, params: Any) -> Outcome:
        """The operation's outcome; raises LeaseLost when the lease is lost (or given back
        at shutdown) before it ends."""
        operation = execution.operation
        spec = operation.spec
        if execution.cancel_requested.is_set() and not operation.handles_cancel:
            return Outcome(
                ResultStatus.CANCELLED,
                error=ConnectorError(ErrorCode.CANCELLED, "cancelled before it started"),
            )
        if not spec.read_only and not operation.self_fenced:
            if execution.attempted_fence:
                return Outcome(ResultStatus.FAILED, error=attempted_before())
            await execution.mark_unsafe_attempt()
        faults.hit("before_execute", execution.action.id)
        execution.task = asyncio.get_running_loop().create_task(
            self._bounded(execution, params)
        )
        lease = execution.lease
        try:
            outcome: Outcome = await execution.task
        except asyncio.CancelledError:
            if lease.lost is None and self.rt.shutting_down:
                await self.release(execution)
            if lease.lost is not None:
                raise LeaseLost(lease.lost) from None
            if execution.cancel_requested.is_set():
                return Outcome(
                    ResultStatus.CANCELLED,
                    error=ConnectorError(ErrorCode.CANCELLED, "cancelled on request"),
                )
            raise
        faults.hit("after_execute", execution.action.id)
        if lease.lost is not None:
            raise LeaseLost(lease.lost)
        return outcome

    async def _bounded(self, execution: Execution, params: Any) -> Outcome:
        """The operation within its deadline; every failure it may end with is an outcome,
        except a lost lease and a failing dependency (the next owner takes over)."""
        action = execution.action
        spec = execution.operation.spec
        enter_scope(
            ReceiptScope(
                log=self.rt.audit,
                action_id=action.id,
                endpoint_id=execution.endpoint.id,
                fence=execution.fence,
                trace_id=action.trace.trace_id if action.trace else None,
            )
        )
        try:
            async with asyncio.timeout(execution.remaining_s()):
                outcome = await execution.operation.execute(execution, params)
            await execution.chunks.confirm()
            return outcome
        except TimeoutError:
            return Outcome(ResultStatus.FAILED, error=deadline_exceeded(spec.name))
        except ConnectorError as exc:
            return Outcome(ResultStatus.FAILED, error=exc)
        except LeaseLost:
            # Found by the operation's own check (the local validity after a pause, a
            # fenced binding write): reported by `run` like the heartbeat's findings.
            raise
        except Exception as exc:
            if is_dependency_failure(exc):
                # Redis, NATS or the network failed, not this Action: the delivery is nak'd
                # and the next owner takes over (and recovers what this one began), instead
                # of a terminal, uncertain result for a passing outage.
                raise
            # No typed path expected this (a bug): settle it as the host's execution failure
            # instead of redelivering the same failure forever (max_deliver is unlimited).
            log.exception("execution of %s failed unexpectedly", action.id)
            return Outcome(ResultStatus.FAILED, error=unexpected_failure(spec.name, exc))

    async def release(self, execution: Execution) -> None:
        """Give the lease back unsettled (shutdown): the next owner need not wait out the
        TTL. From here on the lease is lost to this worker, though not reported as a loss."""
        lease = execution.lease
        lease.ending = lease.released = True
        lease.lose("released unsettled: the worker is shutting down")
        try:
            await self.rt.stores.leases.release(lease.keys, lease.owner, lease.fence)
        except Exception:
            log.warning("could not release lease of %s", execution.action.id)
        for msg in execution.messages:
            await quiet(msg.nak())
        self.rt.audit.emit(
            ReceiptEvent.LEASE_RELEASED,
            action_id=execution.action.id,
            endpoint_id=execution.endpoint.id,
            fence=lease.fence,
        )


def _execute_attributes(
    action: Action, endpoint_id: str, operation: Operation, grant: LeaseGrant
) -> dict[str, tracing.AttrValue]:
    """What an execution span says of its Action (built only when traced)."""
    attributes: dict[str, tracing.AttrValue] = {
        "aip.action_id": action.id,
        "aip.endpoint": endpoint_id,
        "aip.capability": action.capability,
        "aip.fence": grant.fence,
        "aip.takeover": grant.is_takeover,
        "gen_ai.provider.name": "hermes",
        "gen_ai.operation.name": operation.spec.name,
    }
    if grant.other_owner:
        attributes["aip.previous_owner"] = grant.other_owner
    return attributes
