"""`escalations show --reveal`: the command behind an approval escalation, for the authority
members who may decide on it only, and receipted (issue 28).

Real worker process, NATS, Redis, the fake Hermes (whose prompt asks to run
`APPROVAL_COMMAND`), and the real CLI. Redis holds the command only sealed to members' keys.
"""

from __future__ import annotations

import json

from redis.asyncio import Redis

from schemas.audit import ReceiptEvent
from schemas.escalation import EscalationKind
from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_escalations import cli, escalations
from worker.commands.exit_codes import Exit
from worker.store.keys import binding_key
from worker.testing.identities import APPROVER_A, APPROVER_UNTENANTED
from worker.testing.scenario import APPROVAL_COMMAND, NEEDS_APPROVAL


async def test_reveal_is_for_members_only_and_receipted(stack: Stack) -> None:
    source = stack.action("operator", {"objective": f"{NEEDS_APPROVAL} tidy the files"})
    await stack.approve(source)
    await stack.spawn("w1")
    paused = await (await stack.publish(source)).result(timeout_s=60)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    await stack.settled_and_acked(timeout_s=30)
    [escalation] = await escalations(stack)
    assert escalation.kind is EscalationKind.APPROVAL
    assert APPROVAL_COMMAND not in json.dumps(escalation.approval.prompt)  # type: ignore[union-attr]

    # Redis keeps the command sealed only: no plaintext in the binding.
    redis = Redis.from_url(stack.redis_url)
    try:
        fields = await redis.hgetall(binding_key(source.id))
    finally:
        await redis.aclose()
    assert fields
    raw = b"".join(fields.values())
    assert APPROVAL_COMMAND.encode() not in raw
    assert b"pending_command_sealed" in raw

    eid = escalation.escalation_id
    show = ("escalations", "show", eid, "--endpoint", ENDPOINT, "--reveal")
    member_key = str(stack.trust.approver_seed_files[APPROVER_UNTENANTED])
    other_key = str(stack.trust.approver_seed_files[APPROVER_A])

    # A member of another tenant: refused, nothing shown, nothing receipted.
    code, out, err = await cli(stack, *show, "--as", APPROVER_A, "--key", other_key)
    assert code == Exit.REFUSED, err
    assert "not revealed" in err, err
    assert "no approval membership for this tenant" in err, err
    assert APPROVAL_COMMAND not in out + err
    # The right principal with someone else's key: refused too.
    code, out, err = await cli(stack, *show, "--as", APPROVER_UNTENANTED, "--key", other_key)
    assert code == Exit.REFUSED, err
    assert "is not the key of" in err, err
    assert APPROVAL_COMMAND not in out + err
    assert not [
        r for r in await stack.receipts(source.id) if r.event is ReceiptEvent.COMMAND_REVEALED
    ]

    code, out, err = await cli(
        stack, *show, "--as", APPROVER_UNTENANTED, "--key", member_key,
        "--reason", "deciding on the prompt",
    )
    assert code == 0, err
    document = json.loads(out)
    assert document["revealed"]["command"] == APPROVAL_COMMAND
    [receipt] = [
        r for r in await stack.receipts(source.id) if r.event is ReceiptEvent.COMMAND_REVEALED
    ]
    assert receipt.details["by"] == APPROVER_UNTENANTED
    assert receipt.details["escalation_id"] == eid
    assert receipt.details["reason"] == "deciding on the prompt"
    assert APPROVAL_COMMAND not in json.dumps(receipt.details)
