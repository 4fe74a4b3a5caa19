"""Resolve the native child result once the delegated Hermes run has ended.

Hermes completion means only that the provider run ended. The resolver reads the child from
the runtime's stores and verifies it (`worker.delegation.verify`). If no child appears it
waits four poll intervals, bounded to 1-5 s, then fails `delegated_execution_not_observed`:
model prose is never evidence. Once the child is observed it is waited for to the
delegation's deadline, then `delegated_result_not_ready` (the same child may still settle;
it never authorizes creating another) — or `delegated_result_integrity` when the stores
were still disagreeing then (a terminal lifecycle record under a queue entry that never
turned terminal). A transient read failure decides nothing: the next poll reads again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from schemas.delegation import DelegationRequest
from schemas.errors import ErrorCode
from schemas.lifecycle import ChildResult
from worker.delegation.stores import LifecycleStores, StoreRecords
from worker.delegation.verify import verify_child
from worker.errors import ConnectorError, RuntimeRecordsUnreadable
from worker.store.clock import Clock

NOT_OBSERVED_POLLS = 4
NOT_OBSERVED_MIN_S = 1.0
NOT_OBSERVED_MAX_S = 5.0


def not_observed_window_s(poll_s: float) -> float:
    return min(NOT_OBSERVED_MAX_S, max(NOT_OBSERVED_MIN_S, NOT_OBSERVED_POLLS * poll_s))


@dataclass(slots=True)
class DelegatedResolver:
    stores: LifecycleStores
    clock: Clock
    poll_s: float

    async def resolve(
        self,
        request: DelegationRequest,
        tenant_id: str | None,
        remaining_s: Callable[[], float],
        *,
        unseen_is_final: bool = True,
    ) -> ChildResult | None:
        """Wait for the verified terminal result within the window and the deadline.

        With `unseen_is_final` (Hermes completed) a child never seen within the window is
        `delegated_execution_not_observed`; without it (the run failed, was cancelled or is
        unknown) an unseen child returns None, and the run's own outcome stands. Either
        way an observed child is waited for and verified: it happened.
        """
        loop = asyncio.get_running_loop()
        unseen_until = loop.time() + not_observed_window_s(self.poll_s)
        records: StoreRecords | None = None
        observed = False
        while True:
            try:
                records = await self.stores.read(request.action.id)
            except RuntimeRecordsUnreadable:
                records = None
            if records is not None and records.queue is not None:
                observed = True
                result = verify_child(
                    request.action,
                    delegate=request.delegate,
                    tenant_id=tenant_id,
                    queue=records.queue,
                    lifecycle=records.lifecycle,
                    now_ms=await self.clock.now_ms(),
                )
                if result is not None:
                    return result
            out_of_time = remaining_s() <= self.poll_s
            if not observed and (loop.time() >= unseen_until or out_of_time):
                if not unseen_is_final:
                    return None
                raise ConnectorError(
                    ErrorCode.DELEGATED_EXECUTION_NOT_OBSERVED,
                    f"Hermes ended without creating child Action {request.action.id}; its "
                    "final text is not a result",
                )
            if out_of_time:
                raise _not_settled(request, records)
            await asyncio.sleep(self.poll_s)


def _not_settled(request: DelegationRequest, records: StoreRecords | None) -> ConnectorError:
    lifecycle = None if records is None else records.lifecycle
    if lifecycle is not None and lifecycle.state.terminal:
        return ConnectorError(
            ErrorCode.DELEGATED_RESULT_INTEGRITY,
            f"child Action {request.action.id}: the lifecycle is terminal but the queue entry "
            "never was; the stores disagree",
        )
    return ConnectorError(
        ErrorCode.DELEGATED_RESULT_NOT_READY,
        f"child Action {request.action.id} did not settle before the deadline",
    )
