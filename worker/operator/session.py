"""One execution of the operator: its context, policy, binding handle, run slot and deadline.

The slot is taken by the start fence, kept fresh by the observer, and released only by the
binding handle's terminal hook (wired here), so every terminal path releases it.

Every part of the lifecycle (start, observe, approve, cancel) works through this object, so
the deadline and the cancel signal are decided in one place (the one-terminal-chunk rule is
the chunk stream's, worker/execution/chunk_stream.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from schemas.chunk import ChunkKind
from worker.operations.base import ExecutionContext
from worker.operator.capacity import EndpointCapacity
from worker.operator.handle import BindingHandle
from worker.operator.policy import HermesOperatorPolicy
from worker.store.operator_store import OperatorStore

#: Time kept back from the Action's deadline to write the binding's final state: the
#: runtime abandons an execution at the deadline, and a binding left live would be replayed
#: as "still running" instead of the governed timeout it is.
MAX_FINAL_WRITE_MARGIN_S = 2.0
FINAL_WRITE_MARGIN_SHARE = 0.1


class OperatorSession:
    def __init__(
        self,
        ctx: ExecutionContext,
        policy: HermesOperatorPolicy,
        store: OperatorStore,
        *,
        source_action_id: str,
    ) -> None:
        self.ctx = ctx
        self.policy = policy
        self.store = store
        self.source_action_id = source_action_id
        self.capacity = EndpointCapacity(
            store,
            ctx.endpoint.id,
            source_action_id,
            limit=policy.capacity_for(ctx.endpoint),
            slot_ttl_ms=policy.start_claim_ttl_ms,
            poll_s=policy.poll_interval_ms / 1000,
        )
        # A first lease of an Action's own keys (fence 1, no takeover): no owner before this
        # one could have created its binding, so `create` may skip the read (see there).
        first_lease_at = ctx.leased_at_ms
        fresh = not ctx.is_takeover and ctx.keys.slot_action_id == ctx.action.id
        # The run slot is released from one place: the handle's terminal hook, the first
        # time an update leaves the binding terminal, on every terminal path alike.
        self.handle = BindingHandle(
            store,
            ctx.keys,
            ctx.owner,
            ctx.fence,
            created_at_hint_ms=first_lease_at if fresh else 0,
            on_terminal=self.capacity.release,
        )
        loop = asyncio.get_running_loop()
        budget = min(policy.timeout_ms / 1000, ctx.remaining_s())
        margin = min(MAX_FINAL_WRITE_MARGIN_S, budget * FINAL_WRITE_MARGIN_SHARE)
        self.deadline = loop.time() + budget - margin

    @property
    def is_source(self) -> bool:
        return self.ctx.action.id == self.source_action_id

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    def cancel_wanted(self) -> bool:
        """A user cancel is durable: signalled to this execution, or flagged on the binding."""
        return self.ctx.cancel_requested.is_set() or self.handle.cancel_flag

    async def pause(self, seconds: float) -> None:
        """Sleep, but wake at once when a cancel arrives."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, seconds)):
                await self.ctx.cancel_requested.wait()

    def headers(self) -> Mapping[str, str]:
        return self.ctx.trusted_headers()

    async def emit(
        self, kind: ChunkKind, payload: Any = None, *, provider_event: str | None = None
    ) -> None:
        """Publish one chunk, naming the bound run (a terminal kind: see `ctx.emit`)."""
        run_id = self.handle.binding.run_id if self.handle.view is not None else None
        await self.ctx.emit(kind, payload, provider_event=provider_event, run_id=run_id)
