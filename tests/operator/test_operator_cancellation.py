"""Spec "Reconcile cancellation" (and connector "Cancellation").

Intent is durable first (even before a run id exists), stop is sent once a run is bound,
and only provider evidence decides: `cancelled` is cancelled, a racing `completed`/`failed`
wins, anything else at the end of the grace window is `cancellation_outcome_unknown`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from operator_support import BOTH_HERMES, Harness, endpoint_for, error_code, objective
from redis.asyncio import Redis
from scripted_hermes import ScriptedHermes

from schemas.chunk import ChunkKind
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from tests.recording import RecordingContext
from worker.hermes.http_client import HermesClient
from worker.operations.base import Outcome
from worker.operator import request_cancel
from worker.operator.binding import BindingState
from worker.store.stores import Stores
from worker.testing.fake_hermes import FakeHermes, RouteDelay
from worker.testing.scenario import NEEDS_APPROVAL, SLOW_REPLY

STOP = "POST /v1/runs/{run_id}/stop"
START = "POST /v1/runs"


async def _start(h: Harness, text: str) -> tuple[RecordingContext, asyncio.Task[Outcome]]:
    action = h.action(objective(text))
    ctx = await h.lease(action)
    return ctx, asyncio.create_task(h.execute(ctx))


async def _bound(h: Harness, action_id: str) -> str:
    for _ in range(1000):
        binding = await h.binding(action_id)
        if binding is not None and binding.run_id is not None:
            return binding.run_id
        await asyncio.sleep(0.01)
    raise AssertionError("no run was bound")


async def _cancel(redis: Redis, ctx: RecordingContext) -> str | None:
    """What the runtime's cancel handler does: mark the binding, then signal the holder."""
    state = await request_cancel(Stores.over(redis), ctx.action.id)
    ctx.cancel_requested.set()
    return state


@BOTH_HERMES
@pytest.mark.aip_family("cancellation_races", assertions=["before_dispatch_cancelled"])
async def test_cancel_before_run_id_starts_nothing(
    harness: Harness, fake: FakeHermes, redis: Redis
) -> None:
    action = harness.action(objective("never start"))
    assert await request_cancel(Stores.over(redis), action.id) is None  # no binding yet
    ctx = await harness.lease(action)
    ctx.cancel_requested.set()
    outcome = await harness.execute(ctx)

    assert outcome.status is ResultStatus.CANCELLED
    assert fake.stats().count(START) == 0
    binding = await harness.require_binding(action.id)
    assert binding.status is BindingState.CANCELLED
    assert binding.cancel_requested
    assert binding.run_id is None


@BOTH_HERMES
async def test_cancel_while_the_start_is_in_flight_binds_then_stops(
    harness: Harness, fake: FakeHermes, redis: Redis
) -> None:
    """The intent lands while `POST /v1/runs` is in flight: the start is never abandoned
    mid-request (that would make it unknown); the run is bound, then stopped."""
    fake.faults.add(RouteDelay(route=START, delay_s=0.5))
    ctx, task = await _start(harness, f"long {SLOW_REPLY}")
    while (binding := await harness.binding(ctx.action.id)) is None or binding.start_claim is None:
        await asyncio.sleep(0.01)
    assert await _cancel(redis, ctx) == BindingState.CANCELLING.value
    outcome = await task

    assert outcome.status is ResultStatus.CANCELLED
    assert fake.stats().count(START) == 1
    assert fake.stats().count(STOP) == 1
    final = await harness.require_binding(ctx.action.id)
    assert final.status is BindingState.CANCELLED
    assert final.run_id is not None
    assert final.cancel_requested


@BOTH_HERMES
@pytest.mark.aip_family("cancellation_races", assertions=["in_flight_cancelled"])
async def test_cancel_during_a_run_is_cancelled_only_on_provider_evidence(
    harness: Harness, fake: FakeHermes, redis: Redis
) -> None:
    ctx, task = await _start(harness, f"long {SLOW_REPLY}")
    while ChunkKind.DATA not in ctx.kinds():
        await asyncio.sleep(0.01)
    await _cancel(redis, ctx)
    outcome = await task

    assert outcome.status is ResultStatus.CANCELLED
    assert outcome.output["provider"] == {"event": "run.cancelled"}
    assert fake.stats().count(STOP) == 1
    assert ctx.kinds()[-1] is ChunkKind.DONE
    assert ctx.seqs() == list(range(len(ctx.chunks)))
    assert (await harness.require_binding(ctx.action.id)).status is BindingState.CANCELLED


@pytest.mark.aip_family("cancellation_races", assertions=["late_cancel_preserved_terminal"])
async def test_completion_racing_a_cancel_stays_authoritative(
    harness: Harness, redis: Redis
) -> None:
    """Hermes finishes the turn before its interrupt lands: `completed` wins."""
    async with _scripted(harness, redis, stop_mode="complete") as h:
        ctx, task = await _start(h, "finish first")
        await _bound(h, ctx.action.id)
        await _cancel(redis, ctx)
        outcome = await task

    assert outcome.status is ResultStatus.COMPLETED
    assert outcome.output["provider"]["event"] == "run.completed"
    binding = await h.require_binding(ctx.action.id)
    assert binding.status is BindingState.COMPLETED
    assert binding.cancel_requested


async def test_unconfirmed_cancel_is_cancellation_outcome_unknown(
    harness: Harness, redis: Redis
) -> None:
    """`stopping` is progress, never terminal evidence: the grace window runs out."""
    async with _scripted(harness, redis, stop_mode="ignore", cancel_grace_ms=1_000) as h:
        ctx, task = await _start(h, "never confirms")
        await _bound(h, ctx.action.id)
        await _cancel(redis, ctx)
        outcome = await task

    assert outcome.status is ResultStatus.FAILED
    assert error_code(outcome) == ErrorCode.CANCELLATION_OUTCOME_UNKNOWN.value
    assert outcome.error is not None
    assert outcome.error.to_protocol(endpoint_id="e", read_only=False).uncertain_outcome
    statuses = [c.payload.get("status") for c in ctx.chunks if c.payload]
    assert "stopping" in statuses
    binding = await h.require_binding(ctx.action.id)
    assert binding.status is BindingState.OUTCOME_UNKNOWN


@contextlib.asynccontextmanager
async def _scripted(
    harness: Harness, redis: Redis, *, stop_mode: str, **policy: Any
) -> AsyncIterator[Harness]:
    """A harness against a scripted run server whose stop ends as `stop_mode` says."""
    key = "s" * 32
    async with ScriptedHermes(key, prompts=0, stop_mode=stop_mode) as server:
        client = HermesClient(endpoint_for(server.url, key))
        try:
            yield Harness(redis, client, replace(harness.policy, **policy))
        finally:
            await client.aclose()


async def test_cancel_hook_marks_only_active_bindings(harness: Harness, redis: Redis) -> None:
    """A parked (RequiresHuman) or terminal binding is not cancelled by the native cancel
    of its finished invocation; a live one carries the durable intent."""
    parked = harness.action(objective(f"ask {NEEDS_APPROVAL}"))
    outcome, _ = await harness.run(parked)
    assert outcome.status is ResultStatus.REQUIRES_HUMAN
    assert await request_cancel(Stores.over(redis), parked.id) == "waiting_for_approval"
    assert not (await harness.require_binding(parked.id)).cancel_requested

    done = harness.action(objective("quick"))
    await harness.run(done)
    assert await request_cancel(Stores.over(redis), done.id) == "completed"

    ctx, task = await _start(harness, f"long {SLOW_REPLY}")
    await _bound(harness, ctx.action.id)
    assert await request_cancel(Stores.over(redis), ctx.action.id) == "cancelling"
    # The flag alone (no in-process signal) reaches the executing holder on its next write.
    outcome = await asyncio.wait_for(task, timeout=15)
    assert outcome.status is ResultStatus.CANCELLED


async def test_takeover_of_a_cancelling_binding_reconciles_without_starting(
    harness: Harness, fake: FakeHermes, redis: Redis
) -> None:
    ctx, task = await _start(harness, f"long {SLOW_REPLY}")
    await _bound(harness, ctx.action.id)
    await request_cancel(Stores.over(redis), ctx.action.id)
    task.cancel()  # the holder dies before it acts on the intent
    with contextlib.suppress(asyncio.CancelledError):
        await task
    second = await harness.replace_owner(ctx)
    outcome = await harness.execute(second)

    assert outcome.status is ResultStatus.CANCELLED
    assert fake.stats().count(START) == 1
