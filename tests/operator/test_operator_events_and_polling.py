"""Spec "Observe events and recover by polling" (and connector "Streaming and Recovery").

The stream is read once, right after binding; every failure mode of it, every replay and
every takeover fall back to `GET /v1/runs/{id}`, which recognizes exactly seven statuses.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from operator_support import Harness, error_code, expect_lease_lost, objective, wait_for

from schemas.chunk import ChunkKind
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.operations.run_events import EVENT_RULES
from worker.operator import observe
from worker.operator.binding import BindingState
from worker.operator.events import STATUS_READINGS, ProviderStatus, parse_status
from worker.testing.fake_hermes import (
    EventsDisconnect,
    EventsFlood,
    EventsMalformed,
    EventsNotFound,
    EventsOversize,
    FakeHermes,
)
from worker.testing.scenario import LLM_ERROR, SLOW_REPLY, TOOL_ECHO

EVENTS = "GET /v1/runs/{run_id}/events"
STATUS = "GET /v1/runs/{run_id}"

K = ChunkKind


def test_event_table_is_the_spec_mapping() -> None:
    assert {name: rule.kind for name, rule in EVENT_RULES.items()} == {
        "message.delta": K.DATA,
        "reasoning.available": K.THOUGHT,
        "tool.started": K.TOOL,
        "tool.completed": K.TOOL,
        "approval.request": K.PENDING_APPROVAL,
        "run.failed": K.ERROR,
        "run.completed": K.DONE,
        "run.cancelled": K.DONE,
        # After 0.19: a run its gateway's shutdown interrupted.
        "run.interrupted": K.ERROR,
    }


def test_only_the_seven_provider_statuses_and_interrupted_are_recognized() -> None:
    assert {s.value for s in STATUS_READINGS} == {
        "queued",
        "running",
        "waiting_for_approval",
        "stopping",
        "completed",
        "failed",
        "cancelled",
        # After 0.19 (a run a Hermes shutdown interrupted).
        "interrupted",
    }
    assert parse_status("paused") is None
    assert parse_status(None) is None
    assert parse_status("stopping") is ProviderStatus.STOPPING


@pytest.mark.aip_family("streaming_backpressure", assertions=["ordered_chunks"])
async def test_stream_events_become_typed_chunks_in_sequence(
    harness: Harness, fake: FakeHermes
) -> None:
    action = harness.action(objective(f"use the tool {TOOL_ECHO}"))
    outcome, ctx = await harness.run(action)

    assert outcome.status is ResultStatus.COMPLETED
    kinds = ctx.kinds()
    assert kinds[:2] == [K.TOOL, K.TOOL]
    assert K.DATA in kinds
    assert kinds[-2:] == [K.THOUGHT, K.DONE]
    assert ctx.seqs() == list(range(len(ctx.chunks)))
    assert [c.provider_event for c in ctx.chunks][:2] == ["tool.started", "tool.completed"]
    assert {c.run_id for c in ctx.chunks} == {outcome.output["run_id"]}
    binding = await harness.require_binding(action.id)
    assert binding.last_event == "run.completed"
    assert binding.next_sequence == len(ctx.chunks) - 1  # persisted before the done chunk
    assert binding.output is not None
    assert binding.output["event"] == "run.completed"
    assert fake.stats().count(EVENTS) == 1


async def test_tool_preview_is_retained_only_as_a_digest(harness: Harness) -> None:
    _, ctx = await harness.run(harness.action(objective(f"tool {TOOL_ECHO}")))
    started = ctx.chunks[0]
    assert started.provider_event == "tool.started"
    assert started.payload["preview"]["redacted"] is True
    assert "echo" not in str(started.payload)


async def test_run_failed_event_is_an_error_chunk_and_a_failed_binding(
    harness: Harness,
) -> None:
    action = harness.action(objective(f"break {LLM_ERROR}"))
    outcome, ctx = await harness.run(action)

    assert outcome.status is ResultStatus.FAILED
    assert error_code(outcome) == ErrorCode.OPERATOR_FAILED.value
    assert ctx.kinds()[-1] is K.ERROR
    binding = await harness.require_binding(action.id)
    assert binding.status is BindingState.FAILED
    assert binding.output is not None
    assert binding.output["event"] == "run.failed"


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(EventsNotFound(), id="events-404"),
        pytest.param(EventsMalformed(after=1), id="undecodable-frame"),
        pytest.param(EventsOversize(after=1), id="frame-over-1MiB"),
        pytest.param(EventsDisconnect(after=1), id="transport-cut"),
    ],
)
async def test_stream_failure_falls_back_to_polling_to_the_terminal_state(
    harness: Harness,
    fake: FakeHermes,
    fault: EventsNotFound | EventsMalformed | EventsOversize | EventsDisconnect,
) -> None:
    fake.faults.add(fault)
    action = harness.action(objective(f"tool {TOOL_ECHO}"))
    outcome, ctx = await harness.run(action)

    assert outcome.status is ResultStatus.COMPLETED
    assert outcome.output["provider"]["output"]  # the polled status carries the output
    assert fake.stats().count(STATUS) >= 1
    assert ctx.kinds()[-1] is K.DONE
    assert ctx.seqs() == list(range(len(ctx.chunks)))
    assert fake.stats().count("POST /v1/runs") == 1


async def test_event_limit_ends_streaming_and_polling_finishes(
    harness: Harness, fake: FakeHermes
) -> None:
    h = harness.with_policy(max_events=2)
    outcome, ctx = await h.run(h.action(objective(f"tool {TOOL_ECHO}")))

    assert outcome.status is ResultStatus.COMPLETED
    streamed = [c for c in ctx.chunks if c.provider_event is not None]
    assert len(streamed) <= 2
    assert fake.stats().count(STATUS) >= 1


async def test_replayed_invocation_returns_the_stored_result_without_contacting_hermes(
    harness: Harness, fake: FakeHermes
) -> None:
    action = harness.action(objective("once only"))
    first, ctx = await harness.run(action)
    before = fake.stats().routes
    again = await harness.execute(await harness.replace_owner(ctx))

    assert again.status is first.status is ResultStatus.COMPLETED
    assert again.output == first.output
    assert fake.stats().routes == before


@pytest.mark.aip_family("restart_reconnect", assertions=["reconnect_cursor_resumed"])
async def test_takeover_polls_and_continues_the_chunk_sequence(
    harness: Harness, fake: FakeHermes
) -> None:
    """A worker dies mid-stream; the next owner polls (the stream is single-use) and its
    chunks continue the sequence without a gap."""
    action = harness.action(objective(f"long {SLOW_REPLY}"))
    first = await harness.lease(action)
    task = asyncio.create_task(harness.execute(first))
    while len(first.chunks) < 3:
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    second = await harness.replace_owner(first)
    assert second.is_takeover
    outcome = await harness.execute(second)

    assert outcome.status is ResultStatus.COMPLETED
    assert fake.stats().count("POST /v1/runs") == 1
    assert fake.stats().count(EVENTS) == 1  # never re-subscribed
    assert second.seqs() == list(range(len(first.chunks), second.next_seq))
    assert second.kinds()[-1] is K.DONE


async def test_bound_run_answering_404_is_outcome_unknown_with_the_reason(
    harness: Harness, fake: FakeHermes
) -> None:
    """Hermes restarts and forgets the run: not proof of no effect."""
    fake.faults.add(EventsNotFound())
    action = harness.action(objective(f"long {SLOW_REPLY}"))
    ctx = await harness.lease(action)
    task = asyncio.create_task(harness.execute(ctx))
    while fake.stats().count(STATUS) < 2:
        await asyncio.sleep(0.02)
    await fake.restart()
    outcome = await task

    assert outcome.status is ResultStatus.FAILED
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.OPERATOR_OUTCOME_UNKNOWN
    assert "run_not_found" in outcome.error.message
    assert "not proof" in outcome.error.message
    binding = await harness.require_binding(action.id)
    assert binding.status is BindingState.OUTCOME_UNKNOWN
    assert binding.run_id is not None


async def test_unsupported_provider_status_fails_closed(harness: Harness, fake: FakeHermes) -> None:
    fake.faults.add(EventsNotFound())
    action = harness.action(objective(f"long {SLOW_REPLY}"))
    ctx = await harness.lease(action)
    task = asyncio.create_task(harness.execute(ctx))
    while (binding := await harness.binding(action.id)) is None or binding.run_id is None:
        await asyncio.sleep(0.01)
    run = fake.state.runs.get(binding.run_id)
    assert run is not None
    run.status_object = lambda: {"run_id": binding.run_id, "status": "paused"}  # type: ignore[method-assign]
    outcome = await task

    assert outcome.status is ResultStatus.FAILED
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.OPERATOR_OUTCOME_UNKNOWN
    assert "unsupported run status 'paused'" in outcome.error.message


async def test_governed_timeout_is_outcome_unknown_before_the_deadline(
    harness: Harness,
) -> None:
    action = harness.action(objective(f"long {SLOW_REPLY}"), deadline_s=1.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    outcome, _ = await harness.run(action)

    assert loop.time() - started < 1.5  # decided with time left to write it
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.OPERATOR_OUTCOME_UNKNOWN
    assert "timeout" in outcome.error.message
    assert (await harness.require_binding(action.id)).status is BindingState.OUTCOME_UNKNOWN


def _progress_writes(harness: Harness, ctx: Any, hook: Any) -> None:
    """Route every binding write made while the run streams (state `running`, after the
    first chunk) through `hook(call)`, which awaits the real write or replaces it."""
    original = harness.store.write

    async def write(*args: Any) -> Any:
        def call() -> Any:
            return original(*args)

        if args[5] == BindingState.RUNNING.value and ctx.chunks:
            return await hook(call)
        return await call()

    harness.store.write = write  # type: ignore[method-assign]


async def test_a_slow_progress_write_never_holds_back_the_events_behind_it(
    harness: Harness, fake: FakeHermes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The streamed run's Redis bookkeeping runs beside its events, not between them."""
    monkeypatch.setattr(observe, "FLUSH_INTERVAL_S", 0.0)  # every event may write
    fake.faults.add(EventsFlood(count=400))
    h = harness.with_policy(max_events=1_000)
    action = h.action(objective("flood"))
    ctx = await h.lease(action)
    blocked_at: list[int] = []
    release = asyncio.Event()

    async def hold_the_first(write: Any) -> Any:
        if not blocked_at:
            blocked_at.append(len(ctx.chunks))
            await release.wait()
        return await write()

    _progress_writes(h, ctx, hold_the_first)
    run = asyncio.create_task(h.execute(ctx))

    async def moved_on() -> bool:
        return bool(blocked_at) and len(ctx.chunks) >= blocked_at[0] + 100

    await wait_for(moved_on)  # 100 more chunks while the first progress write waits
    release.set()
    outcome = await run
    assert outcome.status is ResultStatus.COMPLETED
    assert ctx.seqs() == list(range(len(ctx.chunks)))
    binding = await h.require_binding(action.id)
    assert binding.next_sequence == len(ctx.chunks) - 1


async def test_a_progress_write_that_finds_the_lease_gone_stops_the_stream(
    harness: Harness, fake: FakeHermes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(observe, "FLUSH_INTERVAL_S", 0.0)
    fake.faults.add(EventsFlood(count=400))
    h = harness.with_policy(max_events=1_000)
    action = h.action(objective("fenced mid-stream"))
    ctx = await h.lease(action)

    async def fenced_out(write: Any) -> Any:
        await h.leases.release(ctx.keys, ctx.owner, ctx.fence)  # the lease passed on
        return await write()

    _progress_writes(h, ctx, fenced_out)
    await expect_lease_lost(h.execute(ctx))
    # The failure of the write made beside the events ends the observation before any
    # conclusion: no terminal chunk, no terminal binding written without the lease.
    assert K.DONE not in ctx.kinds()
    binding = await h.require_binding(action.id)
    assert binding.status is BindingState.RUNNING
