"""Reconcile cancellation: durable intent first, then stop, then provider evidence only.

Spec "Reconcile cancellation": the intent is written to the binding before anything else,
so it survives a crash and can arrive before Hermes returns a run id; once a run is bound,
`POST /v1/runs/{id}/stop` is sent and the status polled for the grace window. Only a
provider `cancelled` becomes a cancelled result; a racing `completed` or `failed` stays
authoritative; anything else at the end of the window is `cancellation_outcome_unknown`.
A `stopping` receipt is progress, never terminal evidence.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from schemas.audit import ReceiptEvent
from schemas.chunk import ChunkKind
from worker.bus.audit import receipt
from worker.operator import provider
from worker.operator.binding import BindingState, OperatorBinding
from worker.operator.observe import CANCEL_GRACE, Observer
from worker.operator.session import OperatorSession
from worker.store.keys import binding_key
from worker.store.operator_store import MarkStatus

if TYPE_CHECKING:
    from worker.store.stores import Stores

S = BindingState

#: Bound on the stop request itself; the grace window does the waiting.
MAX_STOP_REQUEST_S = 10.0

#: Live states in which a durable intent means "cancellation is being reconciled".
_LIVE = frozenset({S.STARTING, S.RUNNING, S.CANCELLING})


def _intend(b: OperatorBinding, now: int) -> OperatorBinding | None:
    if b.status in (S.RUNNING, S.WAITING_FOR_APPROVAL):
        return b.moved(S.CANCELLING, now, cancel_requested=True)
    if not b.cancel_requested:
        return b.changed(now, cancel_requested=True)
    return None


async def reconcile_cancel(session: OperatorSession, observer: Observer) -> OperatorBinding:
    """Cancel the bound run of an active invocation; returns the binding's final state.

    A binding still `starting` only records the intent: its start fence decides (nothing is
    sent after the intent is seen; a start already in flight is bound, then stopped).
    """
    binding = await session.handle.update(_intend)
    if binding.terminal or binding.run_id is None:
        return binding
    left = session.remaining_s()
    stop = await provider.send_stop(
        session.ctx.hermes, binding.run_id, session.headers(), min(left, MAX_STOP_REQUEST_S)
    )
    receipt(
        ReceiptEvent.CANCEL_SENT,
        run_id=binding.run_id,
        outcome=type(stop).__name__,
        provider_code=stop.code if isinstance(stop, provider.CommandRejected) else None,
    )
    if isinstance(stop, provider.CommandApplied):
        status = stop.body.get("status") if isinstance(stop.body, dict) else None
        await session.emit(ChunkKind.PROGRESS, {"status": status or "stopping", "stop": "sent"})
    # A 404 (run already over or forgotten), a 409 `run_not_active` (after 0.19: the run
    # had already finished) or an unknown stop: the status decides.
    grace_s = min(session.policy.cancel_grace_ms / 1000, session.remaining_s())
    until = asyncio.get_running_loop().time() + grace_s
    final = await observer.poll(until, CANCEL_GRACE)
    receipt(ReceiptEvent.CANCEL_CONFIRMED, run_id=binding.run_id, status=final.status.value)
    return final


async def request_cancel(
    stores: Stores, action_id: str, *, source_action_id: str | None = None
) -> str | None:
    """The runtime's cancel hook: record `cancel_requested` on an active operator binding.

    Returns the binding's state after recording (`cancelling` once a live binding carries
    the intent), its unchanged state when no invocation is active (terminal, or waiting for
    approval: a resume with `deny` or `run_stop` is the way to refuse a parked run), or None
    when the Action has no operator binding. A resume Action's binding is its source's, so
    pass `source_action_id` for one; the executing resume also records the intent itself
    when the runtime signals it.
    """
    status, state = await stores.operator.mark_cancel(binding_key(source_action_id or action_id))
    if status is MarkStatus.MISSING:
        return None
    if status in (MarkStatus.RECORDED, MarkStatus.ALREADY_REQUESTED) and S(state) in _LIVE:
        return S.CANCELLING.value
    return state
