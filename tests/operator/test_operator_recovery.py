"""A redelivery that admission refuses after an earlier delivery created the binding.

The refusal (deadline passed, approval expired, credential rotated) forbids only a new
start: an unclaimed binding ends failed with the refusal, certain that nothing was sent;
a bound run is observed to its end. Nothing is settled as "nothing started" when
something did. A resume has begun once its command is in the source's ledger (issue 29):
recovered, it settles that command and never claims or sends a decision.
"""

from __future__ import annotations

import pytest
from operator_support import Harness, endpoint_for, error_code, objective, resume
from redis.asyncio import Redis

from schemas.codec import convert_input
from schemas.errors import ErrorCode
from schemas.operator import OperatorInput
from schemas.result import ResultStatus
from tests.recording import RecordingContext
from worker.errors import ConnectorError
from worker.fingerprints import operator_fingerprint
from worker.hermes.http_client import HermesClient, Transport
from worker.operations.base import Recovering
from worker.operator.binding import (
    ApprovalCommand,
    BindingState,
    CommandState,
    OperatorBinding,
    new_binding,
)
from worker.operator.handle import BindingHandle
from worker.operator.policy import HermesOperatorPolicy
from worker.testing._procs import free_ports
from worker.testing.fake_hermes import FakeHermes
from worker.testing.scenario import NEEDS_APPROVAL

START = "POST /v1/runs"
APPROVAL = "POST /v1/runs/{run_id}/approval"
REFUSAL = ConnectorError(
    ErrorCode.DEADLINE_EXCEEDED,
    "the deadline passed before it was started",
    uncertain_outcome=False,
)


async def test_an_unclaimed_binding_ends_failed_with_the_refusal_and_nothing_is_sent(
    harness: Harness, fake: FakeHermes
) -> None:
    action = harness.action(objective("created, never claimed"))
    first = await harness.lease(action)
    fingerprint = operator_fingerprint(first.endpoint.id, action)
    handle = BindingHandle(harness.store, first.keys, first.owner, first.fence)
    await handle.create(lambda now: new_binding(action, first.endpoint.id, fingerprint, now))
    second = await harness.replace_owner(first)
    params = Recovering(convert_input(action.input, OperatorInput), REFUSAL)
    outcome = await harness.operation.execute(second, params)
    assert outcome.status is ResultStatus.FAILED
    assert error_code(outcome) == ErrorCode.DEADLINE_EXCEEDED.value
    assert outcome.error is not None
    assert outcome.error.to_protocol(endpoint_id=None, read_only=False).uncertain_outcome is False
    assert fake.stats().count(START) == 0
    assert (await harness.require_binding(action.id)).status is BindingState.FAILED


@pytest.mark.aip_family("restart_reconnect", assertions=["state_recovered"])
async def test_a_bound_run_is_observed_to_its_end(harness: Harness, fake: FakeHermes) -> None:
    action = harness.action(objective("bound, then the owner died"))
    first = await harness.lease(action)
    done = await harness.execute(first)
    assert done.status is ResultStatus.COMPLETED
    second = await harness.replace_owner(first)
    params = Recovering(convert_input(action.input, OperatorInput), REFUSAL)
    outcome = await harness.operation.execute(second, params)
    assert outcome.status is ResultStatus.COMPLETED
    assert outcome.output["run_id"] == done.output["run_id"]
    assert fake.stats().count(START) == 1


@pytest.mark.parametrize("transport", ["h1", "aiohttp", "httpx"])
async def test_a_start_that_never_left_this_process_is_not_unknown(
    redis: Redis, transport: Transport
) -> None:
    """Hermes is down (connection refused): `POST /v1/runs` provably never reached it, so
    the claim holder retries within the deadline and then fails certain that nothing
    started, instead of `operator_outcome_unknown` for a run that cannot exist."""
    (port,) = free_ports(1)
    endpoint = endpoint_for(f"http://127.0.0.1:{port}", "k" * 32)
    hermes = HermesClient(endpoint, transport=transport)
    harness = Harness(redis, hermes, HermesOperatorPolicy(poll_interval_ms=50))
    try:
        action = harness.action(objective("hermes is down"), deadline_s=2.5)
        outcome, _ = await harness.run(action)
    finally:
        await hermes.aclose()
    assert outcome.status is ResultStatus.FAILED
    assert outcome.error is not None
    assert error_code(outcome) == ErrorCode.REMOTE_TEMPORARY.value, outcome.error.message
    assert "could not be sent" in outcome.error.message
    assert outcome.error.to_protocol(endpoint_id=None, read_only=False).uncertain_outcome is False
    assert (await harness.require_binding(action.id)).status is BindingState.FAILED


async def _waiting(harness: Harness) -> str:
    """A source Action whose run waits for approval; returns its id."""
    source = harness.action(objective(f"please {NEEDS_APPROVAL}"))
    outcome, _ = await harness.run(source)
    assert outcome.status is ResultStatus.REQUIRES_HUMAN, outcome
    return source.id


def _recovering(ctx: RecordingContext) -> Recovering:
    return Recovering(convert_input(ctx.action.input, OperatorInput), REFUSAL)


async def test_a_resume_refused_before_it_recorded_a_command_sends_nothing(
    harness: Harness, fake: FakeHermes
) -> None:
    source_id = await _waiting(harness)
    ctx = await harness.lease(harness.action(resume(source_id)))
    assert not await harness.operation.began(harness.stores, ctx.keys)
    # Were it recovered anyway (a race with a command written since), it claims nothing.
    with pytest.raises(ConnectorError) as refused:
        await harness.operation.execute(ctx, _recovering(ctx))
    assert refused.value is REFUSAL
    assert fake.stats().count(APPROVAL) == 0
    binding = await harness.require_binding(source_id)
    assert binding.status is BindingState.WAITING_FOR_APPROVAL
    assert binding.command_for(ctx.action.id) is None


async def test_a_resume_claimed_by_a_vanished_owner_recovers_as_outcome_unknown(
    harness: Harness, fake: FakeHermes
) -> None:
    """The owner recorded its claim (and so may have sent the approval), then stopped: the
    refused redelivery settles the claim `approval_outcome_unknown`, uncertain."""
    source_id = await _waiting(harness)
    first = await harness.lease(harness.action(resume(source_id)))
    handle = BindingHandle(harness.store, first.keys, first.owner, first.fence)
    await handle.read()
    fingerprint = operator_fingerprint(first.endpoint.id, first.action)

    def claimed(binding: OperatorBinding, now: int) -> OperatorBinding:
        return binding.with_command(
            ApprovalCommand(
                resume_action_id=first.action.id,
                fingerprint=fingerprint,
                generation=binding.approval_generation,
                choice="once",
                resolve_all=False,
                state=CommandState.CLAIMED,
                claim_id="clm_vanished",
                owner=first.owner,
                fence=first.fence,
                instance_id="w-vanished",
                claimed_at_ms=now,
                expires_at_ms=now + 60_000,
                updated_at_ms=now,
            ),
            now,
        )

    await handle.update(claimed)
    second = await harness.replace_owner(first)
    assert await harness.operation.began(harness.stores, second.keys)
    outcome = await harness.operation.execute(second, _recovering(second))
    assert outcome.status is ResultStatus.FAILED
    assert error_code(outcome) == ErrorCode.APPROVAL_OUTCOME_UNKNOWN.value
    assert outcome.error is not None
    assert outcome.error.to_protocol(endpoint_id=None, read_only=False).uncertain_outcome
    assert fake.stats().count(APPROVAL) == 0  # the recovery sends nothing
    binding = await harness.require_binding(source_id)
    assert binding.status is BindingState.OUTCOME_UNKNOWN
    command = binding.command_for(first.action.id)
    assert command is not None
    assert command.state is CommandState.OUTCOME_UNKNOWN


async def test_an_applied_resume_recovers_as_the_run_ended(
    harness: Harness, fake: FakeHermes
) -> None:
    source_id = await _waiting(harness)
    done, first = await harness.run(harness.action(resume(source_id)))
    assert done.status is ResultStatus.COMPLETED
    second = await harness.replace_owner(first)
    assert await harness.operation.began(harness.stores, second.keys)
    outcome = await harness.operation.execute(second, _recovering(second))
    assert outcome.status is ResultStatus.COMPLETED
    assert outcome.output == done.output
    assert fake.stats().count(APPROVAL) == 1
