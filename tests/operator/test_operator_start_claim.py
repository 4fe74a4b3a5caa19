"""Spec "Fence provider start" and docs/architecture.md §8 "Endpoint capacity".

`POST /v1/runs` is not idempotent: these tests count the requests the fake Hermes received
and the runs it actually created, and check the asymmetric outcome table.
"""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest
from operator_support import BOTH_HERMES, Harness, error_code, objective

from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.execution.cancel_signal import CancelSignal
from worker.operator.binding import BindingState, session_id_for
from worker.testing.fake_hermes import (
    FakeHermes,
    RouteDraining,
    StartDrop,
    StartHang,
    StartNoRunId,
    StartReject,
    StartServerError,
)
from worker.testing.scenario import SLOW_REPLY

START = "POST /v1/runs"


def created_runs(fake: FakeHermes, action_id: str) -> int:
    """Runs the fake really created for this Action's session (whatever its reply said)."""
    return fake.stats().session_starts.get(session_id_for(action_id), 0)


@BOTH_HERMES
async def test_fifty_concurrent_executions_start_exactly_one_run(
    harness: Harness, fake: FakeHermes
) -> None:
    """Fifty executions of one Action under one lease race the claim CAS: one sends."""
    action = harness.action(objective("summarize the case"))
    first = await harness.lease(action)
    contexts = [first] + [
        dataclasses.replace(first, chunks=[], cancel_requested=CancelSignal()) for _ in range(49)
    ]
    outcomes = await asyncio.gather(*(harness.execute(ctx) for ctx in contexts))

    assert fake.stats().count(START) == 1
    assert created_runs(fake, action.id) == 1
    assert {o.status for o in outcomes} == {ResultStatus.COMPLETED}
    assert len({o.output["run_id"] for o in outcomes}) == 1


@pytest.mark.aip_family("restart_reconnect", assertions=["duplicate_effect_prevented"])
async def test_lost_unbound_start_is_outcome_unknown(harness: Harness, fake: FakeHermes) -> None:
    """The claim holder dies inside `POST /v1/runs`; its replacement never sends again."""
    fake.faults.add(StartHang(create_run=True))
    action = harness.action(objective("do the thing"))
    first = await harness.lease(action)
    doomed = asyncio.create_task(harness.execute(first))
    await _until_claimed(harness, action.id)
    await asyncio.sleep(0.1)  # the request is in flight (and the run exists in Hermes)
    doomed.cancel()  # the process is gone: no reply, no binding write
    with pytest.raises(asyncio.CancelledError):
        await doomed

    second = await harness.replace_owner(first)
    assert second.fence > first.fence
    outcome = await harness.execute(second)

    assert outcome.status is ResultStatus.FAILED
    assert error_code(outcome) == ErrorCode.OPERATOR_OUTCOME_UNKNOWN.value
    assert outcome.error is not None
    assert outcome.error.to_protocol(endpoint_id="e", read_only=False).uncertain_outcome
    assert fake.stats().count(START) == 1
    binding = await harness.require_binding(action.id)
    assert binding.status is BindingState.OUTCOME_UNKNOWN
    assert binding.run_id is None

    # A third delivery replays the stored outcome and still sends nothing.
    third = await harness.replace_owner(second)
    again = await harness.execute(third)
    assert error_code(again) == ErrorCode.OPERATOR_OUTCOME_UNKNOWN.value
    assert fake.stats().count(START) == 1


async def test_expired_unbound_claim_is_outcome_unknown_and_never_stolen(
    harness: Harness, fake: FakeHermes
) -> None:
    """A waiter whose sibling's claim expires unbound declares it unknown; one POST total."""
    fake.faults.add(StartHang(create_run=True))
    h = harness.with_policy(start_claim_ttl_ms=1_000)
    action = h.action(objective("slow start"))
    ctx = await h.lease(action)
    sibling = dataclasses.replace(ctx, chunks=[], cancel_requested=CancelSignal())

    outcomes = await asyncio.gather(h.execute(ctx), h.execute(sibling))

    assert [error_code(o) for o in outcomes] == [ErrorCode.OPERATOR_OUTCOME_UNKNOWN.value] * 2
    assert fake.stats().count(START) == 1
    assert (await h.require_binding(action.id)).status is BindingState.OUTCOME_UNKNOWN


@pytest.mark.parametrize(
    ("fault", "remote_status"),
    [
        pytest.param(StartNoRunId(), 202, id="2xx-without-run-id"),
        pytest.param(StartServerError(), 500, id="5xx"),
        pytest.param(StartDrop(), None, id="transport-failure"),
    ],
)
async def test_ambiguous_start_is_outcome_unknown_and_never_replayed(
    harness: Harness,
    fake: FakeHermes,
    fault: StartNoRunId | StartServerError | StartDrop,
    remote_status: int | None,
) -> None:
    fake.faults.add(fault)
    action = harness.action(objective("ambiguous"))
    outcome, ctx = await harness.run(action)

    assert outcome.status is ResultStatus.FAILED
    assert error_code(outcome) == ErrorCode.OPERATOR_OUTCOME_UNKNOWN.value
    assert outcome.error is not None
    assert outcome.error.remote_status == remote_status
    assert created_runs(fake, action.id) == 1  # Hermes did start it
    binding = await harness.require_binding(action.id)
    assert binding.status is BindingState.OUTCOME_UNKNOWN
    assert binding.start_claim is None

    replay = await harness.execute(await harness.replace_owner(ctx))
    assert error_code(replay) == ErrorCode.OPERATOR_OUTCOME_UNKNOWN.value
    assert fake.stats().count(START) == 1
    assert created_runs(fake, action.id) == 1


@BOTH_HERMES
async def test_start_rejected_4xx_is_a_definitive_failure(
    harness: Harness, fake: FakeHermes
) -> None:
    fake.faults.add(StartReject(status=400))
    action = harness.action(objective("rejected"))
    outcome, _ = await harness.run(action)

    assert outcome.status is ResultStatus.FAILED
    assert outcome.error is not None
    error = outcome.error.to_protocol(endpoint_id="hermes-1", read_only=False)
    assert error.code is ErrorCode.OPERATOR_START_REJECTED
    assert error.remote_status == 400
    assert not error.uncertain_outcome
    assert created_runs(fake, action.id) == 0
    assert (await harness.require_binding(action.id)).status is BindingState.FAILED


async def test_rate_limited_start_waits_retry_after_and_starts_once(
    harness: Harness, fake: FakeHermes
) -> None:
    """429 means nothing was created: the claim holder waits and sends again."""
    h = harness.with_policy(max_concurrent_runs=50)  # let Hermes' own cap answer 429
    blockers = [await _occupy(fake) for _ in range(fake.config.max_concurrent_runs)]
    action = h.action(objective("after the queue clears"))

    async def free_one_later() -> None:
        await asyncio.sleep(0.5)
        await _stop(fake, blockers[0])

    freeing = asyncio.create_task(free_one_later())
    outcome, _ = await h.run(action)
    await freeing

    assert outcome.status is ResultStatus.COMPLETED
    assert fake.stats().count(START) >= len(blockers) + 2  # at least one 429, then one 202
    assert created_runs(fake, action.id) == 1
    for run_id in blockers[1:]:
        await _stop(fake, run_id)


async def test_a_draining_gateway_start_is_sent_again_and_starts_once(
    harness: Harness, fake: FakeHermes
) -> None:
    """503 `gateway_draining` is answered before anything is created, like a 429."""
    fake.faults.add(RouteDraining(route=START, times=1))
    action = harness.action(objective("after the drain"))
    outcome, _ = await harness.run(action)

    assert outcome.status is ResultStatus.COMPLETED
    assert fake.stats().count(START) == 2  # the refused one, then the accepted one
    assert created_runs(fake, action.id) == 1


async def test_rate_limited_until_deadline_is_certain_remote_temporary(
    harness: Harness, fake: FakeHermes
) -> None:
    h = harness.with_policy(max_concurrent_runs=50)
    blockers = [await _occupy(fake) for _ in range(fake.config.max_concurrent_runs)]
    action = h.action(objective("never admitted"), deadline_s=3.0)
    outcome, _ = await h.run(action)

    assert outcome.status is ResultStatus.FAILED
    assert outcome.error is not None
    error = outcome.error.to_protocol(endpoint_id="hermes-1", read_only=False)
    assert error.code is ErrorCode.REMOTE_TEMPORARY
    assert not error.uncertain_outcome
    assert not error.retryable
    assert created_runs(fake, action.id) == 0
    assert (await h.require_binding(action.id)).status is BindingState.FAILED
    for run_id in blockers:
        await _stop(fake, run_id)


async def test_endpoint_capacity_admits_no_more_runs_than_its_limit(
    harness: Harness, fake: FakeHermes
) -> None:
    """A full semaphore means no request at all; a terminal run gives its slot back."""
    h = harness.with_policy(max_concurrent_runs=1)
    busy = h.action(objective(f"long {SLOW_REPLY}"))
    busy_ctx = await h.lease(busy)
    running = asyncio.create_task(h.execute(busy_ctx))
    await _until_bound(h, busy.id)
    assert await h.store.capacity_holders("hermes-1") == 1

    starved = h.action(objective("starved"), deadline_s=2.5)
    outcome, _ = await h.run(starved)
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.HOST_CAPACITY
    assert "capacity" in outcome.error.message
    refusal = outcome.error.to_protocol(endpoint_id="hermes-1", read_only=False)
    assert (refusal.retryable, refusal.uncertain_outcome) == (False, False)
    assert created_runs(fake, starved.id) == 0
    assert fake.stats().count(START) == 1

    busy_ctx.cancel_requested.set()
    finished = await running
    assert finished.status in (ResultStatus.CANCELLED, ResultStatus.COMPLETED)
    assert await h.store.capacity_holders("hermes-1") == 0


@pytest.mark.parametrize(
    ("fault", "ending"),
    [
        (None, BindingState.COMPLETED),
        (StartReject(), BindingState.FAILED),
        (StartServerError(), BindingState.OUTCOME_UNKNOWN),
        (StartNoRunId(), BindingState.OUTCOME_UNKNOWN),
    ],
    ids=["completed", "start-rejected", "start-5xx", "start-without-run-id"],
)
async def test_every_terminal_path_releases_the_run_slot_exactly_once(
    harness: Harness,
    fake: FakeHermes,
    monkeypatch: pytest.MonkeyPatch,
    fault: StartReject | StartServerError | StartNoRunId | None,
    ending: BindingState,
) -> None:
    """The slot is released by the binding's one terminal hook, whichever path ended it."""
    if fault is not None:
        fake.faults.add(fault)
    h = harness.with_policy(max_concurrent_runs=1)
    releases: list[str] = []
    release = h.store.capacity_release

    async def counted(endpoint_id: str, holder: str) -> bool:
        releases.append(holder)
        return await release(endpoint_id, holder)

    monkeypatch.setattr(h.store, "capacity_release", counted)
    action = h.action(objective("one run"))
    await h.run(action)

    assert (await h.require_binding(action.id)).status is ending
    assert releases == [action.id]
    assert await h.store.capacity_holders("hermes-1") == 0


# --- helpers -------------------------------------------------------------------------------


async def _until_claimed(h: Harness, action_id: str) -> None:
    for _ in range(500):
        binding = await h.binding(action_id)
        if binding is not None and binding.start_claim is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no start claim was taken")


async def _until_bound(h: Harness, action_id: str) -> None:
    for _ in range(500):
        binding = await h.binding(action_id)
        if binding is not None and binding.run_id is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no run was bound")


async def _occupy(fake: FakeHermes) -> str:
    """Start a slow run directly, to fill Hermes' own concurrent-run cap."""
    async with httpx.AsyncClient(base_url=fake.url) as client:
        reply = await client.post(
            "/v1/runs",
            json={"input": f"blocker {SLOW_REPLY}"},
            headers={"Authorization": f"Bearer {fake.api_key}"},
        )
    assert reply.status_code == 202, reply.text
    run_id: str = reply.json()["run_id"]
    return run_id


async def _stop(fake: FakeHermes, run_id: str) -> None:
    async with httpx.AsyncClient(base_url=fake.url) as client:
        await client.post(
            f"/v1/runs/{run_id}/stop", headers={"Authorization": f"Bearer {fake.api_key}"}
        )
