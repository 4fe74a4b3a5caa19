"""Spec "Understand the durable binding", "Follow the operator states", "Read an operator
result", and the operator's reconciliation commands."""

from __future__ import annotations

import argparse
import asyncio

import msgspec
import pytest
from operator_support import Harness, error_code, expect_lease_lost, make_action, objective
from redis.asyncio import Redis

from schemas.action import DelegationRef
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.commands import operator_admin
from worker.errors import IllegalTransition
from worker.fingerprints import operator_fingerprint
from worker.operator.binding import (
    TERMINAL_STATES,
    TRANSITIONS,
    BindingState,
    OperatorBinding,
    encode_binding,
)
from worker.operator.handle import BindingHandle
from worker.store.keys import binding_key
from worker.store.operator_store import ReconcileStatus, WriteStatus
from worker.testing.fake_hermes import FakeHermes, StartServerError
from worker.testing.scenario import SLOW_REPLY

S = BindingState


def test_eight_states_and_terminal_states_have_no_way_out() -> None:
    assert {s.value for s in TRANSITIONS} == {
        "starting",
        "running",
        "waiting_for_approval",
        "cancelling",
        "completed",
        "failed",
        "cancelled",
        "outcome_unknown",
    }
    assert {S.COMPLETED, S.FAILED, S.CANCELLED, S.OUTCOME_UNKNOWN} == TERMINAL_STATES
    for state in TERMINAL_STATES:
        assert TRANSITIONS[state] == frozenset()
    assert S.STARTING not in set().union(*TRANSITIONS.values())  # nothing returns to start
    assert TRANSITIONS[S.CANCELLING] == TERMINAL_STATES  # an intent is never withdrawn


def _binding(state: BindingState) -> OperatorBinding:
    return OperatorBinding(
        action_id="act_" + "1" * 32,
        request_fingerprint="f",
        endpoint_id="hermes-1",
        session_id="aip-operator-act_" + "1" * 32,
        status=state,
        created_at=0,
        updated_at=0,
    )


def test_illegal_moves_are_refused() -> None:
    with pytest.raises(IllegalTransition) as refused:
        _binding(S.CANCELLING).moved(S.RUNNING, 1)
    assert refused.value.code is ErrorCode.ERROR  # a connector bug, not a provider answer
    with pytest.raises(IllegalTransition):
        _binding(S.COMPLETED).changed(1, last_event="late")
    with pytest.raises(IllegalTransition):
        _binding(S.RUNNING).ended(S.RUNNING, 1)


async def test_terminal_binding_is_write_once_in_redis(harness: Harness) -> None:
    action = harness.action(objective("finish"))
    outcome, ctx = await harness.run(action)
    assert outcome.status is ResultStatus.COMPLETED
    binding = await harness.require_binding(action.id)
    rewrite = msgspec.structs.replace(binding, status=S.FAILED, revision=binding.revision + 1)
    reply = await harness.store.write(
        ctx.keys, ctx.owner, ctx.fence, binding.revision, encode_binding(rewrite), "failed"
    )
    assert reply.status is WriteStatus.TERMINAL
    assert (await harness.require_binding(action.id)).status is S.COMPLETED


@pytest.mark.aip_family("idempotency_duplicates", assertions=["collision_rejected"])
async def test_changed_input_reuse_is_an_idempotency_collision(
    harness: Harness, fake: FakeHermes
) -> None:
    action = harness.action(objective("original"))
    first, ctx = await harness.run(action)
    changed = msgspec.structs.replace(action, input=objective("changed"))
    second = await harness.execute(await harness.replace_owner(ctx, action=changed))

    assert first.status is ResultStatus.COMPLETED
    assert error_code(second) == ErrorCode.OPERATOR_POLICY.value
    assert "collision" in (second.error.message if second.error else "")
    assert fake.stats().count("POST /v1/runs") == 1
    assert (await harness.require_binding(action.id)).status is S.COMPLETED


def test_fingerprint_covers_endpoint_input_and_delegation() -> None:
    action = make_action(objective("same"))
    fp = operator_fingerprint("hermes-1", action)
    assert fp == operator_fingerprint("hermes-1", msgspec.structs.replace(action))
    assert fp != operator_fingerprint("hermes-2", action)
    assert fp != operator_fingerprint(
        "hermes-1", msgspec.structs.replace(action, input=objective("other"))
    )
    delegated = msgspec.structs.replace(action, delegation=DelegationRef(delegation_id="d-1"))
    assert fp != operator_fingerprint("hermes-1", delegated)


async def test_fenced_out_writer_cannot_change_the_binding(
    harness: Harness, fake: FakeHermes
) -> None:
    """A paused worker resumes after its lease passed on: none of its writes land."""
    action = harness.action(objective(f"long {SLOW_REPLY}"))
    stale = await harness.lease(action)
    task = asyncio.create_task(harness.execute(stale))
    while (b := await harness.binding(action.id)) is None or b.run_id is None:
        await asyncio.sleep(0.01)
    fresh = await harness.replace_owner(stale)  # the stale worker is "paused" meanwhile
    before = await harness.require_binding(action.id)

    handle = BindingHandle(harness.store, stale.keys, stale.owner, stale.fence)
    await handle.read()
    await expect_lease_lost(
        handle.update(lambda b, now: b.ended(S.FAILED, now, last_event="forged"))
    )
    task.cancel()  # the runtime cancels a fenced-out execution
    with pytest.raises(asyncio.CancelledError):
        await task
    after = await harness.require_binding(action.id)
    assert after == before

    outcome = await harness.execute(fresh)  # the new owner still finishes the run
    assert outcome.status is ResultStatus.COMPLETED
    assert fake.stats().count("POST /v1/runs") == 1


@pytest.mark.aip_family("idempotency_duplicates", assertions=["delivery_id_stable"])
async def test_result_output_is_the_source_binding_shape(harness: Harness) -> None:
    action = harness.action(objective("shape"))
    outcome, _ = await harness.run(action)

    assert set(outcome.output) == {
        "endpoint_id",
        "run_id",
        "session_id",
        "source_action_id",
        "delegation_id",
        "parent_action_id",
        "status",
        "last_event",
        "pending_approval",
        "approval_generation",
        "provider",
    }
    assert outcome.output["endpoint_id"] == "hermes-1"
    assert outcome.output["session_id"] == f"aip-operator-{action.id}"
    assert outcome.output["source_action_id"] == action.id
    assert outcome.output["status"] == "completed"
    assert outcome.output["provider"]["event"] == "run.completed"
    assert isinstance(outcome.output["provider"]["output"], str)


@pytest.mark.aip_family("audit_redaction", assertions=["sensitive_fields_redacted"])
async def test_binding_show_redacts_provider_output(harness: Harness, redis: Redis) -> None:
    action = harness.action(objective("secret-ish"))
    outcome, _ = await harness.run(action)
    view = await operator_admin.show_binding(redis, action.id)

    assert view is not None
    assert view["status"] == "completed"
    assert view["revision"] >= 3
    assert view["output"]["output"]["redacted"] is True
    assert outcome.output["provider"]["output"] not in str(view)
    assert await operator_admin.show_binding(redis, "act_" + "9" * 32) is None


@pytest.mark.aip_family("errors_uncertain_outcomes", assertions=["uncertain_outcome_reconciled"])
async def test_reconcile_records_one_decision_and_starts_nothing(
    harness: Harness, fake: FakeHermes, redis: Redis
) -> None:
    fake.faults.add(StartServerError())
    action = harness.action(objective("unknown start"))
    outcome, _ = await harness.run(action)
    assert error_code(outcome) == ErrorCode.OPERATOR_OUTCOME_UNKNOWN.value
    before = await redis.hget(binding_key(action.id), "doc")
    routes_before = fake.stats().routes

    report = await operator_admin.reconcile(
        redis,
        harness.hermes,
        action.id,
        decision=operator_admin.Decision.ESCALATED,
        decided_by="oncall:bob",
        note="checked the session log",
    )
    assert report.status is ReconcileStatus.RECORDED
    assert report.decision is not None
    assert report.decision["provider"]["read"] == "no_run_id"
    again = await operator_admin.reconcile(
        redis,
        harness.hermes,
        action.id,
        decision=operator_admin.Decision.NO_EFFECTS_CONFIRMED,
        decided_by="someone-else",
        note="second opinion",
    )
    assert again.status is ReconcileStatus.EXISTS
    assert again.decision == report.decision
    assert await redis.hget(binding_key(action.id), "doc") == before  # terminal doc intact
    assert fake.stats().routes == routes_before  # no provider call without a run id

    done = harness.action(objective("fine"))
    await harness.run(done)
    refused = await operator_admin.reconcile(
        redis,
        harness.hermes,
        done.id,
        decision=operator_admin.Decision.ESCALATED,
        decided_by="x",
        note="y",
    )
    assert refused.status is ReconcileStatus.NOT_UNKNOWN


def test_cli_commands_are_registered() -> None:
    parser = argparse.ArgumentParser()
    operator_admin.add_commands(parser.add_subparsers(dest="command"))
    action_id = "act_" + "a" * 32
    shown = parser.parse_args(["binding", "show", action_id])
    assert shown.func is operator_admin.cmd_binding_show
    assert shown.action_id == action_id
    rec = parser.parse_args(
        ["reconcile", action_id, "--decision", "escalated", "--decided-by", "me", "--note", "n"]
    )
    assert rec.func is operator_admin.cmd_reconcile
    with pytest.raises(SystemExit):
        parser.parse_args(["binding", "show", "not-an-id"])
