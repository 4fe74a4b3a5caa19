"""Spec "Resume a provider approval": the command ledger in the source binding.

Each resume is recorded before Hermes is contacted; the tests count approval requests the
server received to show that a replay sends nothing and a decision never answers a later
prompt.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from operator_support import BOTH_HERMES, Harness, endpoint_for, error_code, objective, resume
from redis.asyncio import Redis
from scripted_hermes import ScriptedHermes

from schemas.chunk import ChunkKind
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.hermes.http_client import HermesClient
from worker.operator.binding import (
    MAX_APPROVAL_COMMANDS,
    ApprovalCommand,
    BindingState,
    CommandState,
    OperatorBinding,
)
from worker.operator.handle import BindingHandle
from worker.operator.policy import HermesOperatorPolicy
from worker.operator.resume import ResumeLedger
from worker.testing.fake_hermes import FakeHermes, RouteError
from worker.testing.scenario import APPROVAL_COMMAND, NEEDS_APPROVAL

APPROVAL = "POST /v1/runs/{run_id}/approval"


async def _parked(h: Harness) -> str:
    """A source Action whose run waits for approval; returns its id."""
    source = h.action(objective(f"please {NEEDS_APPROVAL}"))
    outcome, _ = await h.run(source)
    assert outcome.status is ResultStatus.REQUIRES_HUMAN, outcome
    return source.id


@BOTH_HERMES
@pytest.mark.aip_family("audit_redaction", assertions=["sensitive_fields_redacted"])
async def test_approval_request_returns_requires_human_with_a_redacted_prompt(
    harness: Harness, fake: FakeHermes
) -> None:
    source = harness.action(objective(f"please {NEEDS_APPROVAL}"))
    outcome, ctx = await harness.run(source)

    assert outcome.status is ResultStatus.REQUIRES_HUMAN
    assert outcome.output["status"] == "waiting_for_approval"
    pending = outcome.output["pending_approval"]
    assert pending["event"] == "approval.request"
    assert pending["command"]["redacted"] is True
    assert APPROVAL_COMMAND not in str(outcome.output)
    assert ctx.kinds()[-1] is ChunkKind.PENDING_APPROVAL
    assert ctx.chunks[-1].payload["approval_generation"] == 1
    binding = await harness.require_binding(source.id)
    assert binding.status is BindingState.WAITING_FOR_APPROVAL
    assert binding.approval_generation == 1

    # Replaying the source returns RequiresHuman again, without touching Hermes.
    before = fake.stats().routes
    replay = await harness.execute(await harness.replace_owner(ctx))
    assert replay.status is ResultStatus.REQUIRES_HUMAN
    assert fake.stats().routes == before


@BOTH_HERMES
async def test_resume_continues_the_same_run_to_completion(
    harness: Harness, fake: FakeHermes
) -> None:
    source_id = await _parked(harness)
    resumed = harness.action(resume(source_id, "once"))
    outcome, _ = await harness.run(resumed)

    assert outcome.status is ResultStatus.COMPLETED
    assert outcome.output["source_action_id"] == source_id
    assert outcome.output["status"] == "completed"
    assert fake.stats().count(APPROVAL) == 1
    assert fake.stats().count("POST /v1/runs") == 1
    binding = await harness.require_binding(source_id)
    command = binding.command_for(resumed.id)
    assert command is not None
    assert command.state is CommandState.APPLIED
    assert command.generation == 1
    assert command.choice == "once"


@BOTH_HERMES
@pytest.mark.aip_family("approval_lifecycle", assertions=["resume_once"])
async def test_exact_resume_replay_sends_one_provider_command(
    harness: Harness, fake: FakeHermes
) -> None:
    source_id = await _parked(harness)
    resumed = harness.action(resume(source_id, "once"))
    first, ctx = await harness.run(resumed)
    replay = await harness.execute(await harness.replace_owner(ctx))

    assert fake.stats().count(APPROVAL) == 1
    assert replay.status is first.status is ResultStatus.COMPLETED
    assert replay.output == first.output


@BOTH_HERMES
async def test_deny_that_hermes_completes_is_reported_as_hermes_reports_it(
    harness: Harness,
) -> None:
    source_id = await _parked(harness)
    outcome, _ = await harness.run(harness.action(resume(source_id, "deny")))

    assert outcome.status is ResultStatus.COMPLETED
    assert outcome.output["provider"]["event"] == "run.completed"


async def test_resume_reused_with_changed_input_is_rejected(
    harness: Harness, fake: FakeHermes
) -> None:
    source_id = await _parked(harness)
    resumed = harness.action(resume(source_id, "once"))
    _, ctx = await harness.run(resumed)
    changed = msgspec.structs.replace(resumed, input=resume(source_id, "deny"))
    outcome = await harness.execute(await harness.replace_owner(ctx, action=changed))

    assert error_code(outcome) == ErrorCode.OPERATOR_POLICY.value
    assert "different input" in (outcome.error.message if outcome.error else "")
    assert fake.stats().count(APPROVAL) == 1


async def test_resume_endpoint_must_match_the_source_binding(
    harness: Harness, fake: FakeHermes, redis: Redis
) -> None:
    source_id = await _parked(harness)
    other = HermesClient(endpoint_for(fake.url, fake.api_key, endpoint_id="hermes-2"))
    try:
        h2 = Harness(redis, other, harness.policy)
        outcome, _ = await h2.run(h2.action(resume(source_id, "once")))
    finally:
        await other.aclose()

    assert error_code(outcome) == ErrorCode.OPERATOR_POLICY.value
    assert fake.stats().count(APPROVAL) == 0


async def test_resume_of_a_missing_source_binding_is_operator_policy(harness: Harness) -> None:
    outcome, _ = await harness.run(harness.action(resume("act_" + "0" * 32, "once")))
    assert error_code(outcome) == ErrorCode.OPERATOR_POLICY.value


async def test_approval_transport_failure_marks_command_and_source_unknown(
    harness: Harness, fake: FakeHermes
) -> None:
    source_id = await _parked(harness)
    fake.faults.add(RouteError(route=APPROVAL, status=502))
    resumed = harness.action(resume(source_id, "once"))
    outcome, ctx = await harness.run(resumed)

    assert error_code(outcome) == ErrorCode.APPROVAL_OUTCOME_UNKNOWN.value
    binding = await harness.require_binding(source_id)
    assert binding.status is BindingState.OUTCOME_UNKNOWN
    command = binding.command_for(resumed.id)
    assert command is not None
    assert command.state is CommandState.OUTCOME_UNKNOWN

    replay = await harness.execute(await harness.replace_owner(ctx))
    assert error_code(replay) == ErrorCode.APPROVAL_OUTCOME_UNKNOWN.value
    assert fake.stats().count(APPROVAL) == 1  # never resent


async def test_approval_4xx_is_rejected_and_the_source_keeps_waiting(
    harness: Harness, fake: FakeHermes
) -> None:
    source_id = await _parked(harness)
    fake.faults.add(RouteError(route=APPROVAL, status=400))
    rejected = harness.action(resume(source_id, "once"))
    outcome, _ = await harness.run(rejected)

    assert error_code(outcome) == ErrorCode.REMOTE_REJECTED.value
    assert outcome.error is not None
    assert outcome.error.remote_status == 400
    binding = await harness.require_binding(source_id)
    assert binding.status is BindingState.WAITING_FOR_APPROVAL
    command = binding.command_for(rejected.id)
    assert command is not None
    assert command.state is CommandState.REJECTED

    # A rejected command does not hold the generation: a new resume may answer it.
    retry, _ = await harness.run(harness.action(resume(source_id, "once")))
    assert retry.status is ResultStatus.COMPLETED
    assert fake.stats().count(APPROVAL) == 2


@BOTH_HERMES
async def test_second_resume_for_an_answered_generation_sends_nothing(
    harness: Harness, fake: FakeHermes, redis: Redis
) -> None:
    """Two resumes race for one prompt: one decision per generation."""
    source_id = await _parked(harness)
    binding = await harness.require_binding(source_id)
    first = harness.action(resume(source_id, "once"))
    ctx = await harness.lease(first)
    handle = BindingHandle(harness.store, ctx.keys, ctx.owner, ctx.fence)
    await handle.read()
    # The first resume has claimed generation 1 (and is, say, paused before sending).
    await handle.update(
        lambda b, now: b.with_command(
            _command(first.id, b.approval_generation, ctx.owner, ctx.fence, now), now
        )
    )
    second, _ = await harness.run(harness.action(resume(source_id, "deny")))

    assert error_code(second) == ErrorCode.OPERATOR_POLICY.value
    assert f"generation {binding.approval_generation}" in (
        second.error.message if second.error else ""
    )
    assert fake.stats().count(APPROVAL) == 0


@pytest.mark.aip_family("approval_lifecycle", assertions=["resume_once"])
async def test_two_resumes_read_before_either_claims_and_one_decision_is_sent(
    harness: Harness, fake: FakeHermes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two resumes for one prompt, each reading the source binding before the other's
    claim lands: the claim itself must refuse the second, not only the read before it.
    Found by the chaos campaign (tests/chaos, seed 1, no faults): two approvals were sent
    for one generation, and Hermes answered the second 409."""
    source_id = await _parked(harness)
    both_read = asyncio.Barrier(2)
    waited: set[str] = set()
    claim = ResumeLedger._claim

    async def claim_after_both_read(self: ResumeLedger, binding: OperatorBinding) -> Any:
        if self.resume_id not in waited:  # the first claim of each: after both reads
            waited.add(self.resume_id)
            await asyncio.wait_for(both_read.wait(), 10)
        return await claim(self, binding)

    monkeypatch.setattr(ResumeLedger, "_claim", claim_after_both_read)
    ends = await asyncio.gather(
        harness.run(harness.action(resume(source_id, "once"))),
        harness.run(harness.action(resume(source_id, "once"))),
    )
    codes = sorted(str(error_code(outcome)) for outcome, _ in ends)
    assert fake.stats().count(APPROVAL) == 1
    assert codes == ["None", ErrorCode.OPERATOR_POLICY.value]


async def test_ledger_is_capped_at_256_commands(harness: Harness, fake: FakeHermes) -> None:
    source_id = await _parked(harness)
    holder = harness.action(resume(source_id, "deny"))
    ctx = await harness.lease(holder)
    handle = BindingHandle(harness.store, ctx.keys, ctx.owner, ctx.fence)
    await handle.read()

    def fill(binding: OperatorBinding, now: int) -> OperatorBinding:
        for _ in range(MAX_APPROVAL_COMMANDS):
            command = _command(
                "act_" + secrets.token_hex(16), 0, ctx.owner, ctx.fence, now, CommandState.REJECTED
            )
            binding = binding.with_command(command, now)
        return binding

    await handle.update(fill)
    outcome, _ = await harness.run(harness.action(resume(source_id, "once")))

    assert error_code(outcome) == ErrorCode.OPERATOR_POLICY.value
    assert "maximum of 256" in (outcome.error.message if outcome.error else "")
    assert fake.stats().count(APPROVAL) == 0


# --- generation isolation (a run that asks twice) ------------------------------------------


@pytest_asyncio.fixture
async def twice(redis: Redis) -> AsyncIterator[tuple[Harness, ScriptedHermes]]:
    key = secrets.token_urlsafe(32)
    async with ScriptedHermes(key) as stub:
        client = HermesClient(endpoint_for(stub.url, key))
        try:
            yield Harness(redis, client, HermesOperatorPolicy(poll_interval_ms=10)), stub
        finally:
            await client.aclose()


async def test_generation_isolation_replay_never_answers_a_later_prompt(
    twice: tuple[Harness, ScriptedHermes],
) -> None:
    h, stub = twice
    source = h.action(objective("two approvals"))
    parked, _ = await h.run(source)
    assert parked.status is ResultStatus.REQUIRES_HUMAN
    assert (await h.require_binding(source.id)).approval_generation == 1

    first = h.action(resume(source.id, "once"))
    answered, first_ctx = await h.run(first)
    assert answered.status is ResultStatus.REQUIRES_HUMAN  # the run asked again
    binding = await h.require_binding(source.id)
    assert binding.approval_generation == 2
    assert stub.counts["POST /v1/runs/{run_id}/approval"] == 1

    # Replaying the first resume returns its stored progress and answers nothing.
    replay = await h.execute(await h.replace_owner(first_ctx))
    assert replay.status is ResultStatus.REQUIRES_HUMAN
    assert stub.counts["POST /v1/runs/{run_id}/approval"] == 1
    run = stub.runs[binding.run_id or ""]
    assert run.choices == ["once"]

    # Only a new resume answers generation 2.
    second = h.action(resume(source.id, "session"))
    done, _ = await h.run(second)
    assert done.status is ResultStatus.COMPLETED
    assert run.choices == ["once", "session"]
    final = await h.require_binding(source.id)
    assert [(c.generation, c.state) for c in final.approval_commands] == [
        (1, CommandState.APPLIED),
        (2, CommandState.APPLIED),
    ]


async def test_resume_cancelled_before_sending_leaves_the_source_waiting(
    harness: Harness, fake: FakeHermes
) -> None:
    source_id = await _parked(harness)
    resumed = harness.action(resume(source_id, "once"))
    ctx = await harness.lease(resumed)
    ctx.cancel_requested.set()
    outcome = await harness.execute(ctx)

    assert outcome.status is ResultStatus.CANCELLED
    assert fake.stats().count(APPROVAL) == 0
    binding = await harness.require_binding(source_id)
    assert binding.status is BindingState.WAITING_FOR_APPROVAL
    await asyncio.sleep(0)


def _command(
    resume_id: str,
    generation: int,
    owner: str,
    fence: int,
    now: int,
    state: CommandState = CommandState.CLAIMED,
) -> ApprovalCommand:
    return ApprovalCommand(
        resume_action_id=resume_id,
        fingerprint="f" * 64,
        generation=generation,
        choice="once",
        resolve_all=False,
        state=state,
        claim_id="clm_test",
        owner=owner,
        fence=fence,
        instance_id="worker-test",
        claimed_at_ms=now,
        expires_at_ms=now + 60_000,
        updated_at_ms=now,
    )
