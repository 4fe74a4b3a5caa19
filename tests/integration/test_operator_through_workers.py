"""The governed operator end to end: real worker processes, real NATS and Redis, the fake
Hermes counting every request. One Action means at most one Hermes run, whatever happens
to the workers or to Hermes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
import pytest

from schemas.audit import ReceiptEvent
from schemas.chunk import DoneChunk, PendingApprovalChunk
from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.client import ActionHandle
from worker.testing.pytest_plugin import on_processes_and_containers
from worker.testing.scenario import NEEDS_APPROVAL, REPLY_PREFIX, SLOW_REPLY

POST_RUNS = "POST /v1/runs"


@on_processes_and_containers
@pytest.mark.aip_family("streaming_backpressure", assertions=["ordered_chunks"])
async def test_objective_streams_deltas_and_settles_the_operator_output(stack: Stack) -> None:
    await stack.spawn("w1")
    action, handle = await stack.operator("summarize the case")
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    output = result.output
    assert output["status"] == "completed"
    assert output["session_id"] == f"aip-operator-{action.id}"
    assert output["source_action_id"] == action.id
    assert output["run_id"].startswith("run_")
    assert output["provider"]["output"].startswith(REPLY_PREFIX)
    chunks = [c async for c in handle.chunks(idle_timeout_s=10)]
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert [c.kind for c in chunks if c.provider_event == "message.delta"]
    assert isinstance(chunks[-1], DoneChunk)
    assert stack.fake.stats().count(POST_RUNS) == 1


async def test_fifty_concurrent_deliveries_across_three_workers_start_one_run(
    stack: Stack,
) -> None:
    for n in range(3):
        await stack.spawn(f"w{n}")
    action, handle = await stack.operator("one run only")
    await asyncio.gather(*(stack.publish(action, dedupe=False) for _ in range(49)))
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    await stack.settled_and_acked(timeout_s=60)
    assert stack.fake.stats().count(POST_RUNS) == 1
    assert len(await stack.results(action.id)) == 1


@pytest.mark.parametrize(
    ("point", "status", "code", "posts"),
    [
        # The run slot is taken, the binding (created already claimed) is not: nothing
        # exists to be unsure about, so the next owner starts the run once.
        ("before_create", "completed", None, 1),
        # Created claimed (or claimed): the start may have left, it is never sent again.
        ("after_claim", "failed", "connector.hermes_agent.operator_outcome_unknown", 0),
        ("after_post_run", "failed", "connector.hermes_agent.operator_outcome_unknown", 1),
        ("after_bind", "completed", None, 1),
        ("mid_stream", "completed", None, 1),
        ("after_settle", "completed", None, 1),
    ],
)
async def test_kill_at_each_step_ends_in_the_right_state_without_a_second_start(
    stack: Stack, point: str, status: str, code: str | None, posts: int
) -> None:
    action = stack.action("operator", {"objective": f"{SLOW_REPLY} {point}"})
    await stack.approve(action)
    w1 = await stack.spawn("w1", fault_points=f"{point}=exit@{action.id}")
    handle = await stack.publish(action)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    await stack.spawn("w2")
    result = await handle.result(timeout_s=60)
    assert result.status.value == status, result.error
    assert (result.error.code if result.error else None) == code
    if code is not None:
        assert result.error is not None
        assert result.error.uncertain_outcome is True
        assert result.error.retryable is False
    assert stack.fake.stats().count(POST_RUNS) == posts
    await stack.settled_and_acked(timeout_s=30)
    assert len(await stack.results(action.id)) == 1
    chunks = await stack.chunks(action.id)
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    if point == "after_post_run":
        # Killed once the start was sent: the receipts that led to it were handed to the
        # bus before it left (`AuditLog.hand_over`), so the dead owner's claim is on record.
        by_w1 = [r.event for r in await stack.receipts(action.id) if r.worker_id == "w1"]
        assert ReceiptEvent.START_CLAIMED in by_w1, by_w1


async def test_paused_owner_is_taken_over_by_polling_and_never_settles(stack: Stack) -> None:
    w1 = await stack.spawn("w1")
    action, handle = await stack.operator(f"{SLOW_REPLY} pause me")
    await stack.wait_owner(action.id, "w1")
    # Paused once the run is bound (paused between the POST and the bind, w1 leaves an
    # unbound claim that w2 rightly settles `outcome_unknown`), and before w2 starts:
    # starting a worker can take longer than the run on a loaded machine, and w1 must not
    # get to settle first.
    await stack.wait_bound(action.id)
    w1.pause()
    await stack.spawn("w2")
    result = await handle.result(timeout_s=60)
    w1.resume()
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.settled_by == "w2"
    await asyncio.sleep(2.0)
    assert w1.alive
    assert len(await stack.results(action.id)) == 1
    assert stack.fake.stats().count(POST_RUNS) == 1
    chunks = await stack.chunks(action.id)
    assert [c.seq for c in chunks] == list(range(len(chunks)))


@pytest.mark.aip_family("restart_reconnect", assertions=["duplicate_effect_prevented"])
async def test_hermes_restart_during_a_bound_run_is_outcome_unknown_not_a_replay(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    _, handle = await stack.operator(f"{SLOW_REPLY} restart hermes")
    while stack.fake.stats().count(POST_RUNS) == 0:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    await stack.fake.restart()
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.operator_outcome_unknown"
    assert result.error.uncertain_outcome is True
    assert stack.fake.stats().count(POST_RUNS) == 1


@pytest.mark.aip_family("approval_lifecycle", assertions=["resume_once"])
async def test_approval_pauses_then_one_resume_command_completes_the_same_run(
    stack: Stack, record_property: Callable[[str, object], None]
) -> None:
    await stack.spawn("w1")
    source, handle = await stack.operator(f"{NEEDS_APPROVAL} tidy the files")
    record_property("aip_artifact", source.id)
    paused = await handle.result(timeout_s=30)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    chunks = [c async for c in handle.chunks(idle_timeout_s=10)]
    assert any(isinstance(c, PendingApprovalChunk) for c in chunks)
    resume, resumed = await stack.resume(source.id, "once")
    record_property("aip_artifact", resume.id)
    result = await resumed.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.output["source_action_id"] == source.id
    await stack.publish(resume, dedupe=False)  # a replay the duplicate window let through
    await stack.settled_and_acked(timeout_s=30)
    assert stack.fake.stats().count("POST /v1/runs/{run_id}/approval") == 1
    assert stack.fake.stats().count(POST_RUNS) == 1
    assert len(await stack.results(resume.id)) == 1


async def test_cancel_during_a_run_is_cancelled_on_provider_evidence(stack: Stack) -> None:
    await stack.spawn("w1")
    _, handle = await stack.operator(f"{SLOW_REPLY} cancel me")
    while stack.fake.stats().count(POST_RUNS) == 0:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    reply = await handle.cancel(requested_by="user:demo", reason="changed my mind")
    assert reply.accepted
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.CANCELLED, result.error
    assert stack.fake.stats().count("POST /v1/runs/{run_id}/stop") == 1


@pytest.mark.aip_family("cancellation_races", assertions=["before_dispatch_cancelled"])
async def test_cancel_before_the_action_is_delivered_starts_nothing(stack: Stack) -> None:
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "never start"})
    await stack.approve(action)
    handle = stack.client.handle("h1", action.id)
    # No worker holds it: answered at once (wait 0) with a retryable error and the facts.
    reply = await handle.cancel(requested_by="user:demo", wait_s=0)
    assert reply.error is not None
    assert (reply.accepted, reply.state, reply.error.code.value) == (
        True,
        "pending",
        "connector_host.not_ready",
    )
    assert reply.error.retryable
    await stack.publish(action)
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.CANCELLED
    assert stack.fake.stats().count(POST_RUNS) == 0


async def _redelivered_after_the_deadline(stack: Stack, text: str, point: str) -> ActionHandle:
    """An approved objective whose owner dies at `point`; the next worker starts only once
    the Action's deadline (2.5 s) has passed. Returns the handle to await."""
    action = stack.action("operator", {"objective": text})
    w1 = await stack.spawn("w1", fault_points=f"{point}=exit@{action.id}")
    # The deadline counts from a ready worker: starting one takes seconds on a loaded machine,
    # and a deadline that passes before w1 is up tests nothing.
    deadline = time.time_ns() // 1_000_000 + 2_500
    action = msgspec.structs.replace(action, deadline_unix_ms=deadline)
    await stack.approve(action)
    handle = await stack.publish(action)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    while time.time_ns() // 1_000_000 < deadline + 200:
        await asyncio.sleep(0.1)
    await stack.spawn("w2")
    return handle


async def test_a_redelivery_after_the_deadline_observes_the_run_instead_of_refusing(
    stack: Stack,
) -> None:
    # The owner dies right after binding the run; the next delivery comes after the Action's
    # deadline. Admission refuses a *start* then, but the run exists: it is observed to its
    # end, never settled as "the deadline passed before it was started".
    handle = await _redelivered_after_the_deadline(stack, "recover me", "after_bind")
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.settled_by == "w2"
    assert result.output["run_id"].startswith("run_")
    assert stack.fake.stats().count(POST_RUNS) == 1


async def test_a_refused_redelivery_before_any_binding_fails_certain(stack: Stack) -> None:
    # The owner dies before executing: no binding, nothing sent. When the deadline has
    # passed by the next delivery it is refused, certain that nothing started. (A binding
    # created but never claimed: tests/operator/test_operator_recovery.py.)
    handle = await _redelivered_after_the_deadline(stack, "never claimed", "before_execute")
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.deadline_exceeded"
    assert result.error.uncertain_outcome is False
    assert stack.fake.stats().count(POST_RUNS) == 0
