"""Signed approval decisions through a live worker: Redis write access is not approval.

A decision counts only when the key its approver's membership names signed it. A record
written into Redis any other way is `approval_authorization_conflict`, and Hermes is never
asked to start anything.
"""

from __future__ import annotations

import msgspec
import pytest
from redis.asyncio import Redis

from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.fingerprints import approval_fingerprint
from worker.store.approvals import read_records, slot_fields
from worker.store.keys import approvals_key
from worker.testing.identities import APPROVER_UNTENANTED

POST_RUNS = "POST /v1/runs"
CONFLICT = "connector_host.approval_authorization_conflict"


def _runs(stack: Stack) -> int:
    assert stack.fake is not None
    return stack.fake.stats().count(POST_RUNS)


@pytest.mark.aip_family("approval_lifecycle", assertions=["authority_verified"])
async def test_an_approval_written_to_redis_without_the_approvers_signature_runs_nothing(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    # A genuine decision on another Action is the template the forger copies.
    template = stack.action("operator", {"objective": "template"})
    await stack.approve(template)
    action = stack.action("operator", {"objective": "approve me yourself"})
    client = Redis.from_url(stack.redis_url)
    try:
        [genuine] = await read_records(client, template.id)
        forged = msgspec.structs.replace(
            genuine,
            decision_id="apr_" + "d" * 32,
            action_id=action.id,
            input_fingerprint=approval_fingerprint(action),
        )
        fields = slot_fields(forged, msgspec.json.encode(forged), signature="", signer="")
        await client.hset(approvals_key(action.id), mapping=fields)
    finally:
        await client.aclose()
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert (result.error.code, result.error.retryable) == (CONFLICT, False)
    assert "no signature" in result.error.message
    assert _runs(stack) == 0


async def test_a_signed_approval_runs_the_action(stack: Stack) -> None:
    await stack.spawn("w1")
    action = stack.action("operator", {"objective": "properly approved"})
    await stack.approve(action, approver=APPROVER_UNTENANTED)
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert _runs(stack) == 1
