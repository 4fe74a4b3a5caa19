"""A real lease in Redis, kept by a `LeaseKeeper` as an execution: what the heartbeat and
its backstop thread see of one, without a JetStream message or an operation behind it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from schemas.ids import new_action_id
from worker.execution.leases import HeldLease, LeaseKeeper
from worker.store.keys import ActionKeys
from worker.store.lease_store import LeaseStore


async def held_lease(
    store: LeaseStore,
    keeper: LeaseKeeper[Any],
    ttl_ms: int,
    *,
    task: asyncio.Task[Any] | None = None,
) -> tuple[HeldLease, SimpleNamespace]:
    """Acquire a lease for a new Action (its own owner token) and hand it to `keeper`;
    `task` is what a loss cancels."""
    action_id = new_action_id()
    keys = ActionKeys.of(action_id)
    owner = f"w#{action_id}"
    grant = await store.acquire(keys, owner, ttl_ms, "fp")
    lease = HeldLease(keys, owner, grant, ttl_ms=ttl_ms)

    async def in_progress() -> None:
        """The delivery's in-progress signal (no JetStream message behind it here)."""

    execution = SimpleNamespace(
        lease=lease, keys=keys, action=SimpleNamespace(id=action_id), task=task,
        cancel_requested=asyncio.Event(), in_progress=in_progress,
        endpoint=SimpleNamespace(id="h1"), operation=SimpleNamespace(handles_cancel=True),
        log_fields=dict,
    )  # fmt: skip
    keeper.add(execution)  # type: ignore[arg-type]
    return lease, execution
