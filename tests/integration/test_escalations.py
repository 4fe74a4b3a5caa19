"""Escalations end to end: real worker processes, NATS and Redis, the fake Hermes, and the
real `aip-hermes-worker escalations` CLI. One escalation per Action and approval
generation, raised by the settling owner only; an approval answered with one command."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any

import msgspec
import pytest

from schemas.escalation import Escalation, EscalationKind, EscalationResolution
from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from worker.aip.signing import AipSigner
from worker.commands.exit_codes import Exit
from worker.testing.identities import APPROVER_UNTENANTED
from worker.testing.scenario import NEEDS_APPROVAL, SLOW_REPLY
from worker.wire.escalations import decode_escalation, decode_resolution

APPROVAL_POST = "POST /v1/runs/{run_id}/approval"
POST_RUNS = "POST /v1/runs"


async def escalations(stack: Stack) -> list[Escalation]:
    """Every escalation Envelope on the stream, decoded (signed or not: the tests that need
    a trusted signature check it themselves)."""
    return [
        decode_escalation(data)[0]
        for data in await stack.stream_messages("escalations", stack.subjects.escalations(ENDPOINT))
    ]


async def resolutions(stack: Stack) -> list[EscalationResolution]:
    return [
        decode_resolution(data)[0]
        for data in await stack.stream_messages(
            "escalations", stack.subjects.escalation_resolutions(ENDPOINT)
        )
    ]


async def cli(stack: Stack, *args: str) -> tuple[int, str, str]:
    """Run `python -m worker ARGS` with the workers' settings (off the event loop)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker",
        *args,
        env={**os.environ, **stack.env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def resolve(stack: Stack, escalation_id: str, *extra: str) -> tuple[int, str, str]:
    return await cli(
        stack,
        "escalations",
        "resolve",
        escalation_id,
        "--endpoint",
        ENDPOINT,
        "--reason",
        "checked the command with the owner",
        *extra,
    )


async def resolve_as_approver(
    stack: Stack, escalation_id: str, choice: str = "once"
) -> tuple[int, str, str]:
    """`escalations resolve` as the untenanted approver, with its key and the gateway's."""
    return await resolve(
        stack,
        escalation_id,
        "--as",
        APPROVER_UNTENANTED,
        "--key",
        str(stack.trust.approver_seed_files[APPROVER_UNTENANTED]),
        "--choice",
        choice,
        "--sign-key",
        str(stack.trust.seed_file),
    )


@pytest.mark.parametrize("point", ["after_settle", "after_escalation"])
async def test_an_approval_escalation_is_raised_once_across_a_takeover_and_resolved_into_one_resume(
    stack: Stack, point: str
) -> None:
    source = stack.action("operator", {"objective": f"{NEEDS_APPROVAL} tidy the files"})
    await stack.approve(source)
    w1 = await stack.spawn("w1", fault_points=f"{point}=exit@{source.id}")
    handle = await stack.publish(source)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    await stack.spawn("w2")
    paused = await handle.result(timeout_s=60)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    await stack.settled_and_acked(timeout_s=30)

    raised = await escalations(stack)
    assert len(raised) == 1, raised
    escalation = raised[0]
    assert escalation.kind is EscalationKind.APPROVAL
    assert escalation.action_id == source.id
    assert escalation.raised_by == "w1"  # the settling owner; w2 only republished it
    assert escalation.approval is not None
    assert escalation.approval.source_action_id == source.id
    assert escalation.approval.approval_generation == 1
    assert escalation.approval.prompt.get("event") == "approval.request"
    assert "chmod" not in json.dumps(escalation.approval.prompt)  # the command is a digest
    assert escalation.principal_id == source.identity.principal_id

    code, out, err = await cli(stack, "escalations", "list", "--endpoint", ENDPOINT)
    assert code == 0, err
    assert escalation.escalation_id in out
    assert "open" in out
    assert re.search(r" \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", out), out  # ISO 8601 UTC

    key = str(stack.trust.approver_seed_files[APPROVER_UNTENANTED])
    answer = ("--as", APPROVER_UNTENANTED, "--key", key, "--choice", "once", "--sign-key")
    code, out, err = await resolve(
        stack, escalation.escalation_id, *answer, str(stack.trust.seed_file)
    )
    assert code == 0, err
    resolution = msgspec.json.decode(out, type=EscalationResolution)
    resume_id = resolution.resume_action_id
    assert resume_id is not None
    assert resolution.resolved_by == APPROVER_UNTENANTED

    resumed = await stack.client.handle(ENDPOINT, resume_id).result(timeout_s=60)
    assert resumed.status is ResultStatus.COMPLETED, resumed.error
    assert resumed.output["source_action_id"] == source.id

    # The same command again (a person unsure it worked): the same resume, nothing new.
    code, out, err = await resolve(
        stack, escalation.escalation_id, *answer, str(stack.trust.seed_file)
    )
    assert code == 0, err
    # Another choice afterwards is refused: the escalation was answered.
    code, _, err = await resolve(
        stack,
        escalation.escalation_id,
        "--as",
        APPROVER_UNTENANTED,
        "--key",
        key,
        "--choice",
        "deny",
        "--sign-key",
        str(stack.trust.seed_file),
    )
    assert code == Exit.REFUSED, err
    assert "already" in err, err
    await stack.settled_and_acked(timeout_s=30)

    assert stack.fake is not None
    assert stack.fake.stats().count(APPROVAL_POST) == 1
    assert stack.fake.stats().count(POST_RUNS) == 1
    assert len(await stack.results(resume_id)) == 1
    assert len(await escalations(stack)) == 1  # the completed resume raised none
    assert [r.escalation_id for r in await resolutions(stack)] == [escalation.escalation_id]
    code, out, err = await cli(stack, "escalations", "list", "--endpoint", ENDPOINT)
    assert code == 0, (out, err)
    assert out == "", (out, err)


async def test_a_paused_stale_owner_raises_no_escalation(stack: Stack) -> None:
    source = stack.action("operator", {"objective": f"{NEEDS_APPROVAL} pause the owner"})
    await stack.approve(source)
    w1 = await stack.spawn("w1", fault_points=f"after_execute=pause@{source.id}")
    handle = await stack.publish(source)
    await stack.wait_owner(source.id, "w1")
    assert stack.fake is not None
    while stack.fake.stats().count(POST_RUNS) == 0:
        await asyncio.sleep(0.05)
    await stack.spawn("w2")
    paused = await handle.result(timeout_s=60)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    assert paused.settled_by == "w2"
    w1.resume()  # the stale owner wakes up holding the same outcome
    await stack.settled_and_acked(timeout_s=30)
    await asyncio.sleep(2.0)
    assert w1.alive
    raised = await escalations(stack)
    assert [e.raised_by for e in raised] == ["w2"]
    assert "escalation" not in w1.log_text(), w1.log_tail()
    assert "escalation esc_" in stack.workers[1].log_text()


async def test_an_outcome_unknown_is_escalated_and_acknowledged_once(stack: Stack) -> None:
    await stack.spawn("w1")
    action, handle = await stack.operator(f"{SLOW_REPLY} restart hermes")
    assert stack.fake is not None
    while stack.fake.stats().count(POST_RUNS) == 0:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    await stack.fake.restart()
    result = await handle.result(timeout_s=60)
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.operator_outcome_unknown"
    await stack.settled_and_acked(timeout_s=30)

    raised = await escalations(stack)
    assert len(raised) == 1
    escalation = raised[0]
    assert escalation.kind is EscalationKind.DECISION
    assert escalation.code == "connector.hermes_agent.operator_outcome_unknown"
    assert escalation.uncertain_outcome is True
    assert "Never replay POST /v1/runs" in escalation.decision
    assert f"aip-hermes-worker binding show {action.id}" in escalation.evidence
    raw = msgspec.json.encode(escalation).decode()
    assert stack.fake.api_key not in raw

    # An answer for approvals only is refused on a decision escalation: nothing recorded;
    # so is an acknowledgement without the key that signs its resolution.
    key = str(stack.trust.approver_seed_files[APPROVER_UNTENANTED])
    code, _, err = await resolve(
        stack, escalation.escalation_id, "--as", "ops:erin", "--key", key, "--choice", "once"
    )
    assert code == 2, err
    code, _, err = await resolve(stack, escalation.escalation_id, "--as", "ops:erin")
    assert code == 2, err
    assert "--key" in err, err
    assert await resolutions(stack) == []
    code, out, err = await resolve(
        stack, escalation.escalation_id, "--as", "ops:erin", "--key", key
    )
    assert code == 0, err
    assert msgspec.json.decode(out, type=EscalationResolution).resolved_by == "ops:erin"
    code, _, err = await resolve(
        stack, escalation.escalation_id, "--as", "ops:frank", "--key", key
    )
    assert code == Exit.REFUSED, err
    assert "ops:erin" in err, err
    # The stream's copy: a handoff_completed resolution signed with the key given.
    [copy] = await stack.stream_messages(
        "escalations", stack.subjects.escalation_resolutions(ENDPOINT)
    )
    resolution, opened = decode_resolution(copy)
    assert (resolution.resolved_by, resolution.kind.value) == ("ops:erin", "acknowledged")
    assert opened.payload["status"] == "handoff_completed"
    assert opened.verified is not None
    approver = stack.trust.approver_seeds[APPROVER_UNTENANTED]
    assert opened.verified.did == AipSigner.from_nkey_seed(approver).did

    code, out, err = await cli(
        stack, "escalations", "show", escalation.escalation_id, "--endpoint", ENDPOINT
    )
    assert code == 0, err
    shown: dict[str, Any] = json.loads(out)
    assert shown["resolution"]["kind"] == "acknowledged"
    assert shown["resolution"]["reason"] == "checked the command with the owner"
    code, out, _ = await cli(stack, "escalations", "list", "--endpoint", ENDPOINT, "--all")
    assert escalation.escalation_id in out
    assert "resolved:acknowledged" in out
