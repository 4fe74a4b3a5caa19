"""The operator against a Hermes newer than 0.19 (the fake with its post-0.19 flags), through
real worker processes, real NATS and Redis: a lost start is learnt back by re-sending it
with its durable key instead of settling `outcome_unknown`; a Hermes restart interrupts a
run with a typed answer; an approval after the run ended is `run_not_active`; an approval
names its prompt (`request_id`) and only an offered choice is sent. The same scenarios
against 0.19 (no advertisement) keep today's answers."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time

import pytest

from schemas.chunk import PendingApprovalChunk
from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.operator.start import RUN_KEY_PREFIX
from worker.testing.fake_hermes import FakeConfig, FakeHermes, RunStatus, upstream
from worker.testing.scenario import NEEDS_APPROVAL, SLOW_REPLY

POST_RUNS = "POST /v1/runs"
APPROVAL = "POST /v1/runs/{run_id}/approval"
#: A prompt nobody answers is denied by Hermes after this (then the run completes).
APPROVAL_TIMEOUT_S = 1.5


def _config(**changes: object) -> FakeConfig:
    # The stack replaces the key with its own.
    return FakeConfig(api_key=secrets.token_urlsafe(32), **changes)  # type: ignore[arg-type]


UPSTREAM = upstream(_config(approval_timeout_s=APPROVAL_TIMEOUT_S))
HERMES_019 = _config(approval_timeout_s=APPROVAL_TIMEOUT_S)


@pytest.fixture
def fake_config() -> FakeConfig | None:
    """Every test here runs against the post-0.19 fake unless it parametrizes this."""
    return UPSTREAM


def _runs_created(fake: FakeHermes) -> int:
    return sum(fake.stats().session_starts.values())


def _start_requests(fake: FakeHermes) -> list[tuple[str | None, object]]:
    """(Idempotency-Key, body) of every `POST /v1/runs` the fake received, in order."""
    rows = []
    for request in fake.requests():
        if request.route == POST_RUNS:
            headers = {k.lower(): v for k, v in request.headers.items()}
            rows.append((headers.get("idempotency-key"), request.body))
    return rows


@pytest.mark.parametrize(
    ("point", "posts"),
    [
        # Killed once the start was sent, before its run id was recorded: today's
        # `outcome_unknown`. The takeover re-sends it and Hermes answers the same run.
        ("after_post_run", 2),
        # Killed with the claim recorded, before anything was sent: the re-send is the
        # first request Hermes sees, so it starts the run (0.19: `outcome_unknown`, 0 posts).
        ("after_claim", 1),
    ],
)
async def test_a_lost_start_is_re_sent_with_its_key_and_the_takeover_completes_one_run(
    stack: Stack, point: str, posts: int
) -> None:
    fake = stack.fake
    assert fake is not None
    action = stack.action("operator", {"objective": f"{SLOW_REPLY} lost start {point}"})
    await stack.approve(action)
    w1 = await stack.spawn("w1", fault_points=f"{point}=exit@{action.id}")
    handle = await stack.publish(action)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    await stack.spawn("w2")
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.settled_by == "w2"
    # Exactly one run, whatever number of requests it took to learn it.
    assert _runs_created(fake) == 1
    assert fake.stats().count(POST_RUNS) == posts
    starts = _start_requests(fake)
    keys = {key for key, _ in starts}
    (key,) = keys
    assert (key or "").startswith(RUN_KEY_PREFIX)
    assert all(body == starts[0][1] for _, body in starts)  # byte-identical re-send
    assert fake.state.runs.get(result.output["run_id"]) is not None
    await stack.settled_and_acked(timeout_s=30)
    assert len(await stack.results(action.id)) == 1
    chunks = await stack.chunks(action.id)
    assert [c.seq for c in chunks] == list(range(len(chunks)))


@pytest.mark.parametrize("fake_config", [HERMES_019])
async def test_without_the_advertisement_a_lost_start_is_still_outcome_unknown(
    stack: Stack,
) -> None:
    # Hermes 0.19 advertises nothing: no derived key is sent, nothing is re-sent, and the
    # lost start settles exactly as before.
    fake = stack.fake
    assert fake is not None
    action = stack.action("operator", {"objective": f"{SLOW_REPLY} 0.19 lost start"})
    await stack.approve(action)
    w1 = await stack.spawn("w1", fault_points=f"after_post_run=exit@{action.id}")
    handle = await stack.publish(action)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    await stack.spawn("w2")
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.operator_outcome_unknown"
    assert result.error.uncertain_outcome is True
    assert fake.stats().count(POST_RUNS) == 1
    ((key, _),) = _start_requests(fake)
    assert key is None or not key.startswith(RUN_KEY_PREFIX)


async def test_a_hermes_restart_interrupts_the_bound_run_with_a_typed_result(
    stack: Stack,
) -> None:
    fake = stack.fake
    assert fake is not None
    await stack.spawn("w1")
    action, handle = await stack.operator(f"{SLOW_REPLY} restart hermes")
    await stack.wait_bound(action.id)
    await asyncio.sleep(0.3)
    await fake.restart()
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.operator_interrupted"
    assert result.error.uncertain_outcome is True
    assert result.error.retryable is False
    assert result.output["status"] == "failed"
    assert fake.stats().count(POST_RUNS) == 1


async def _wait_run_terminal(fake: FakeHermes, run_id: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = fake.state.runs.get(run_id)
        if run is not None and run.status is RunStatus.COMPLETED:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the run never ended")


@pytest.mark.parametrize(
    ("fake_config", "code"),
    [
        (UPSTREAM, "connector.hermes_agent.operator_run_not_active"),
        # 0.19 answers 409 `approval_not_active`: a plain rejection.
        (HERMES_019, "connector.hermes_agent.remote_rejected"),
    ],
    ids=["upstream", "0.19"],
)
async def test_a_resume_after_the_run_ended_is_refused_typed(stack: Stack, code: str) -> None:
    fake = stack.fake
    assert fake is not None
    await stack.spawn("w1")
    source, handle = await stack.operator(f"{NEEDS_APPROVAL} nobody answers")
    paused = await handle.result(timeout_s=30)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    # Hermes denies the unanswered prompt itself, and the run completes.
    await _wait_run_terminal(fake, await stack.wait_bound(source.id))
    _, resumed = await stack.resume(source.id, "once")
    result = await resumed.result(timeout_s=60)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == code
    assert result.error.uncertain_outcome is False
    assert result.error.remote_status == 409
    # The source binding took the run's own outcome on the way.
    assert result.output["status"] == "completed"


@pytest.mark.parametrize(
    "fake_config",
    [dataclasses.replace(UPSTREAM, approval_choices=("once", "deny"), approval_timeout_s=60.0)],
)
async def test_an_approval_names_its_prompt_and_only_an_offered_choice_is_sent(
    stack: Stack,
) -> None:
    fake = stack.fake
    assert fake is not None
    await stack.spawn("w1")
    source, handle = await stack.operator(f"{NEEDS_APPROVAL} choose wisely")
    paused = await handle.result(timeout_s=30)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    chunks = [c async for c in handle.chunks(idle_timeout_s=10)]
    (prompt,) = [c for c in chunks if isinstance(c, PendingApprovalChunk)]
    assert prompt.payload["choices"] == ["once", "deny"]
    request_id = prompt.payload["request_id"]
    assert request_id.startswith("apr_")

    _, refused = await stack.resume(source.id, "always")
    result = await refused.result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.approval_choice_not_offered"
    assert fake.stats().count(APPROVAL) == 0  # refused before anything was sent

    _, resumed = await stack.resume(source.id, "once")
    result = await resumed.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    (sent,) = [r.body for r in fake.requests() if r.route == APPROVAL]
    assert sent == {"choice": "once", "request_id": request_id}
