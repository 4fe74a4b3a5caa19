"""Endpoint capacity: a Redis semaphore of open runs per endpoint, shared by every worker.

docs/architecture.md §8 "Endpoint capacity", a deliberate
addition to the spec: Hermes 0.19 answers an
11th open run with 429 and executes only a few at once, so workers admit operator starts
per endpoint. A slot is held by the *source* Action id, so duplicate deliveries and resumes
of one run share one slot. It is released when the run is terminal or its binding is
abandoned (outcome unknown), from one place only: the binding handle's terminal hook
(worker/operator/handle.py, wired by the session). A slot whose holder vanished (a lost
lease, a crash: the run may be live under the next holder) frees itself at its expiry, which
the holder keeps pushing forward while it observes the run.
"""

from __future__ import annotations

import asyncio
import random
import time

from worker.store.operator_store import OperatorStore

#: Slots expire unless refreshed; refresh when this share of the TTL has passed.
REFRESH_SHARE = 1 / 3


class EndpointCapacity:
    """The run slots of one endpoint for one execution's holder."""

    def __init__(
        self,
        store: OperatorStore,
        endpoint_id: str,
        holder: str,
        *,
        limit: int,
        slot_ttl_ms: int,
        poll_s: float,
    ) -> None:
        self.store = store
        self.endpoint_id = endpoint_id
        self.holder = holder
        self.limit = limit
        self.slot_ttl_ms = slot_ttl_ms
        self.poll_s = poll_s
        self._refreshed_at = 0.0

    async def acquire(self, budget_s: float) -> bool:
        """Wait for a slot up to `budget_s`; False when the endpoint stayed full."""
        deadline = time.monotonic() + budget_s
        while True:
            acquired, _ = await self.store.capacity_acquire(
                self.endpoint_id, self.holder, self.limit, self.slot_ttl_ms
            )
            if acquired:
                self._refreshed_at = time.monotonic()
                return True
            # Jitter keeps many waiting workers from polling in lockstep.
            pause = self.poll_s * (0.5 + random.random())
            if time.monotonic() + pause >= deadline:
                return False
            await asyncio.sleep(pause)

    async def keep(self, *, ttl_ms: int | None = None, force: bool = False) -> None:
        """Refresh the slot of a run that exists (counted even when the set is full).

        Called on every observation step; it only reaches Redis once per third of the TTL
        unless `force` (e.g. to park the slot for a long approval wait).
        """
        now = time.monotonic()
        if not force and now - self._refreshed_at < self.slot_ttl_ms / 1000 * REFRESH_SHARE:
            return
        await self.store.capacity_acquire(
            self.endpoint_id,
            self.holder,
            self.limit,
            self.slot_ttl_ms if ttl_ms is None else ttl_ms,
            force=True,
        )
        self._refreshed_at = now

    async def release(self) -> None:
        await self.store.capacity_release(self.endpoint_id, self.holder)
