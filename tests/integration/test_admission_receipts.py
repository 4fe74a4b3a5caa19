"""Audit integrity, read back from the audit stream.

An admitted Action's chain records who it runs for and who approved it (an `admitted`
receipt: signer, principal, credential revision, tenant, approver, decision id). An envelope
that failed authentication never appends to the chain of the Action id it claims: its
`dead_lettered` receipt is filed under the DLQ entry's own id.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from schemas.audit import ReceiptEvent
from schemas.ids import is_dlq_id
from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from worker.testing.identities import APPROVER_UNTENANTED, REVISION, USER_UNTENANTED


@pytest.mark.aip_family("approval_lifecycle", assertions=["evidence_persisted"])
async def test_an_admitted_receipt_names_principal_tenant_approver_and_decision(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    action, handle = await stack.operator("leave an admission trail")
    assert (await handle.result(timeout_s=30)).status is ResultStatus.COMPLETED
    await asyncio.sleep(1.0)
    receipts = await stack.client.receipts(ENDPOINT, action.id)
    events = [r.event for r in receipts]
    assert events.index(ReceiptEvent.RECEIVED) < events.index(ReceiptEvent.ADMITTED)
    assert events.index(ReceiptEvent.ADMITTED) < events.index(ReceiptEvent.LEASE_ACQUIRED)
    [admitted] = [r for r in receipts if r.event is ReceiptEvent.ADMITTED]
    details = admitted.details
    assert details["principal_id"] == USER_UNTENANTED
    assert details["credential_revision"] == REVISION
    assert "tenant_id" in details
    assert details["tenant_id"] is None  # the demo principal has no tenant
    assert details["approver_principal_id"] == APPROVER_UNTENANTED
    assert str(details["approval_decision_id"]).startswith("apr_")
    assert str(details["signer"]).startswith("U")
    # A read-only Action without approval records that no one approved it.
    models = stack.action("models")
    await (await stack.publish(models)).result(timeout_s=20)
    await asyncio.sleep(1.0)
    [plain] = [r for r in await stack.receipts(models.id) if r.event is ReceiptEvent.ADMITTED]
    assert plain.details["approver_principal_id"] is None
    assert plain.details["approval_decision_id"] is None


async def test_unauthenticated_envelopes_reusing_an_action_id_never_touch_its_chain(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    victim = stack.action("models")
    result = await (await stack.publish(victim)).result(timeout_s=20)
    assert result.status is ResultStatus.COMPLETED
    await asyncio.sleep(1.0)
    chain_before = await stack.receipts(victim.id)
    assert chain_before
    # The same id, unsigned and with a signature over other bytes.
    await stack.publish(victim, msg_id="unsigned-copy", signed=False)
    # The genuine signature over another input: it does not verify over this Envelope.
    forged = json.loads(stack.trust.seal_action(victim))
    forged["body"]["action"]["input"] = {"forged": True}
    await stack.nc.jetstream().publish(
        stack.subjects.actions(ENDPOINT),
        json.dumps(forged).encode(),
        headers={"Nats-Msg-Id": "forged-copy"},
    )
    await stack.settled_and_acked()
    await asyncio.sleep(1.0)
    assert await stack.receipts(victim.id) == chain_before
    dead = await stack.dlq()
    assert [h["code"] for _, h in dead] == ["connector_host.authentication"] * 2
    dlq_ids = [h["dlq_id"] for _, h in dead]
    assert all(is_dlq_id(d) for d in dlq_ids)
    assert len(set(dlq_ids)) == 2
    for dlq_id in dlq_ids:
        [receipt] = await stack.client.receipts(ENDPOINT, dlq_id)
        assert receipt.event is ReceiptEvent.DEAD_LETTERED
        assert receipt.action_id == dlq_id
        assert receipt.details["claimed_action_id"] == victim.id
        assert receipt.details["code"] == "connector_host.authentication"
