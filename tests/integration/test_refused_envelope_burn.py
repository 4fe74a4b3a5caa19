"""A refused envelope under an approved Action's id does not burn the id (issue 24, medium).

A forgery published first under an approved Action's id -- another body signed by a key
holder (wrong content: refused by the approval check), or any body without a valid
signature -- used to use the id up: the refusal settled a failed result under the id, so
the genuine envelope then met an idempotency collision and never ran; or its bare-id
`Nats-Msg-Id` made JetStream drop the genuine publish as a duplicate. Now a plain refusal is
settled `refused`, which another request under the id clears (`lua/lease_acquire.lua`),
and the dedupe id is bound to the bytes (`envelope_msg_id`): forge first, genuine second,
and the genuine runs, once.
"""

from __future__ import annotations

import asyncio

import msgspec

from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from worker.trust.responses import sha256_hex

POST_RUNS = "POST /v1/runs"
DLQ_CODE = "code"


def _runs(stack: Stack) -> int:
    assert stack.fake is not None
    return stack.fake.stats().count(POST_RUNS)


async def test_a_refused_forgery_first_leaves_the_id_to_the_genuine_action(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    genuine = stack.action("operator", {"objective": "the approved work"})
    await stack.approve(genuine)
    # Same id, other content, validly signed (a key holder, a delegator naming the id):
    # the approval was given for the genuine request, so this one is refused.
    forged = msgspec.structs.replace(genuine, input={"objective": "rm -rf / (forged)"})
    forged_handle = await stack.publish(forged)
    refusal = await stack.client.handle(
        ENDPOINT, forged.id, envelope_sha256=sha256_hex(stack.trust.seal_action(forged))
    ).result(timeout_s=30)
    assert refusal.status is ResultStatus.FAILED
    assert refusal.error is not None
    assert "approval" in refusal.error.code.value
    assert forged_handle.action_id == genuine.id

    handle = await stack.client.publish(genuine)
    assert not handle.duplicate
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.action_sha256 == sha256_hex(stack.trust.seal_action(genuine))
    await stack.settled_and_acked()
    assert _runs(stack) == 1
    assert await stack.dlq() == []  # no collision: the refusal held nothing of the id
    # Now the id is the genuine one's: a copy of the forgery is the collision, a copy of the
    # genuine is answered from its stored result; neither runs, nothing new is settled.
    await stack.publish(forged, dedupe=False)
    await stack.publish(genuine, dedupe=False)
    await stack.settled_and_acked()
    for _ in range(50):
        if await stack.dlq():
            break
        await asyncio.sleep(0.1)
    [(_, headers)] = await stack.dlq()
    assert headers["code"] == "connector.hermes_agent.operator_policy"
    assert _runs(stack) == 1
    statuses = sorted(r.status.value for r in await stack.results(genuine.id))
    assert statuses == ["completed", "failed"]


async def test_a_forgery_without_a_valid_signature_first_does_not_drop_the_genuine(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    genuine = stack.action("operator", {"objective": "the approved work"})
    await stack.approve(genuine)
    forged = stack.trust.seal_action(
        msgspec.structs.replace(genuine, input={"objective": "forged"}), signed=False
    )
    # Unsigned, under the genuine Action's bare id as its dedupe id: the old squat.
    await stack.nc.jetstream().publish(
        stack.subjects.actions(ENDPOINT), forged, headers={"Nats-Msg-Id": genuine.id}
    )
    handle = await stack.client.publish(genuine)
    assert not handle.duplicate
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    await stack.settled_and_acked()
    [(_, headers)] = await stack.dlq()
    assert headers["code"] == "connector_host.authentication"
    assert _runs(stack) == 1
    assert [r.status for r in await stack.results(genuine.id)] == [ResultStatus.COMPLETED]


async def test_a_refusal_of_an_id_already_claimed_still_meets_its_state(stack: Stack) -> None:
    """Genuine first, forgery second: the id has state, so the forgery is the collision it
    always was (dead-lettered), and nothing is published over the genuine result."""
    await stack.spawn("w1")
    genuine = stack.action("operator", {"objective": "the approved work"})
    await stack.approve(genuine)
    result = await (await stack.client.publish(genuine)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    forged = msgspec.structs.replace(genuine, input={"objective": "forged later"})
    await stack.publish(forged)
    await stack.settled_and_acked()
    for _ in range(50):
        if await stack.dlq():
            break
        await asyncio.sleep(0.1)
    [(_, headers)] = await stack.dlq()
    assert headers["code"] == "connector.hermes_agent.operator_policy"
    assert [r.status for r in await stack.results(genuine.id)] == [ResultStatus.COMPLETED]
    assert _runs(stack) == 1
