"""After a takeover, status polling leaves receipts on state changes only (issue 28).

The new owner of a bound run follows it by `GET /v1/runs/{run_id}` every 250 ms. Each poll
used to leave a `provider_request` receipt: one Action left ~190 receipts, against 8.
Now a poll is receipted when what it read (HTTP status, run status) differs from the
previous receipted read for the Action (`worker.bus.audit.polled`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

from schemas.audit import ReceiptEvent
from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.testing.identities import USER_UNTENANTED
from worker.testing.scenario import HELD_REPLY

STATUS = "GET /v1/runs/{run_id}"
STATUS_ROUTE = "/v1/runs/{run_id}"
#: Status polls the new owner makes before the test cancels the run (~4 s at 250 ms).
POLLS = 16


async def test_a_taken_over_run_is_receipted_on_state_changes_not_per_poll(stack: Stack) -> None:
    assert stack.fake is not None
    w1 = await stack.spawn("w1")
    action, handle = await stack.operator(f"{HELD_REPLY} take me over")
    await stack.wait_owner(action.id, "w1")
    await stack.wait_bound(action.id)
    w1.kill()
    await stack.spawn("w2")
    await stack.wait_owner(action.id, "w2", timeout_s=30)
    before = stack.fake.stats().count(STATUS)
    # The new owner follows the run by polling, every 250 ms, for a few seconds.
    while stack.fake.stats().count(STATUS) - before < POLLS:
        await asyncio.sleep(0.1)
    reply = await handle.cancel(requested_by=USER_UNTENANTED, reason="enough polling")
    assert reply.accepted
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.CANCELLED, result.error
    assert result.settled_by == "w2"
    polls = stack.fake.stats().count(STATUS)
    receipts = await stack.receipts(action.id)
    status_receipts = [
        r for r in receipts
        if r.event is ReceiptEvent.PROVIDER_REQUEST and r.details.get("route") == STATUS_ROUTE
    ]
    states = [r.details.get("run_status") for r in status_receipts if r.worker_id == "w2"]
    # Polled POLLS times or more; receipted once per state it read (running, then the
    # stopping or cancelled states), never twice in a row for the same one.
    assert polls >= POLLS, polls
    assert states[0] == "running", states
    assert all(a != b for a, b in itertools.pairwise(states)), states
    assert len(states) <= 4, (polls, states)
    assert len(receipts) <= 30, Counter(r.event.value for r in receipts)
