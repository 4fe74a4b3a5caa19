"""Resolve the native child result once the delegated Hermes run has ended.

Hermes completion means only that the provider run ended. The resolver reads the child from
the runtime's stores and verifies it (`worker.delegation.verify`). If no child appears it
waits four poll intervals, bounded to 1-5 s, then fails `delegated_execution_not_observed`:
model prose is never evidence. Once the child is observed it may wait to the delegation's
deadline for a terminal result, then fails `delegated_result_not_ready` (retryable: the same
child may still settle; it never authorizes creating another).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from schemas.delegation import DelegationRequest
from schemas.errors import ErrorCode
from schemas.lifecycle import ChildResult
from worker.delegation.stores import LifecycleStores, StoreUnreadable
from worker.delegation.verify import verify_child
from worker.errors import ConnectorError
from worker.trust.clock import Clock

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

    async def look(self, request: DelegationRequest, tenant_id: str | None) -> ChildResult | None:
        """One read: the verified terminal result, or None (absent, not terminal, unreadable)."""
        try:
            records = await self.stores.read(request.action.id)
        except StoreUnreadable:
            return None
        if records.queue is None:
            return None
        return verify_child(
            request.action,
            delegate=request.delegate,
            tenant_id=tenant_id,
            queue=records.queue,
            lifecycle=records.lifecycle,
            now_ms=await self.clock.now_ms(),
        )

    async def resolve(
        self,
        request: DelegationRequest,
        tenant_id: str | None,
        remaining_s: Callable[[], float],
    ) -> ChildResult:
        """Wait for the verified terminal result within the window and the deadline."""
        loop = asyncio.get_running_loop()
        unseen_until = loop.time() + not_observed_window_s(self.poll_s)
        observed = False
        while True:
            try:
                records = await self.stores.read(request.action.id)
            except StoreUnreadable:
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
                raise ConnectorError(
                    ErrorCode.DELEGATED_EXECUTION_NOT_OBSERVED,
                    f"Hermes ended without creating child Action {request.action.id}; its "
                    "final text is not a result",
                )
            if out_of_time:
                raise ConnectorError(
                    ErrorCode.DELEGATED_RESULT_NOT_READY,
                    f"child Action {request.action.id} did not settle before the deadline",
                )
            await asyncio.sleep(self.poll_s)
