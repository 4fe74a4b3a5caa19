"""A resume redelivered past its deadline after its approval was sent is outcome unknown.

Issue 29, the chaos campaign (seed 1300, rule `honest`): a resume's owner claimed the
command, sent the approval to Hermes and was cut off before recording Hermes' answer; the
next delivery, past the resume's deadline, was refused `deadline_exceeded` with
`uncertain_outcome: false`, as if nothing had been sent. The command recorded in the
source binding's ledger is the resume's attempt record: a refused redelivery now recovers
it (`OperatorOperation.began`, `worker/operator/resume.py` `forbid_claim`) and settles it
`approval_outcome_unknown`, uncertain, sending nothing again.
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.testing.scenario import NEEDS_APPROVAL

APPROVAL = "POST /v1/runs/{run_id}/approval"
#: Time for w1, already up and idle, to fetch the resume and send its approval.
DEADLINE_MS = 3_000


async def test_a_refused_redelivery_after_the_approval_was_sent_is_outcome_unknown(
    stack: Stack,
) -> None:
    source = stack.action("operator", {"objective": f"{NEEDS_APPROVAL} tidy the files"})
    resume = stack.action("operator", {"resume": {"source_action_id": source.id, "choice": "once"}})
    w1 = await stack.spawn("w1", fault_points=f"after_post_approval=exit@{resume.id}")
    await stack.approve(source)
    paused = await (await stack.publish(source)).result(timeout_s=30)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error

    # The deadline counts from here (w1 is up): it passes while no worker holds the resume.
    deadline = time.time_ns() // 1_000_000 + DEADLINE_MS
    resume = msgspec.structs.replace(resume, deadline_unix_ms=deadline)
    await stack.approve(resume)
    handle = await stack.publish(resume)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    assert stack.fake is not None
    assert stack.fake.stats().count(APPROVAL) == 1  # the approval reached Hermes
    while time.time_ns() // 1_000_000 < deadline + 200:
        await asyncio.sleep(0.1)

    await stack.spawn("w2")
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.approval_outcome_unknown", result.error
    assert result.error.uncertain_outcome is True
    assert result.error.retryable is False
    assert result.settled_by == "w2"
    await stack.settled_and_acked(timeout_s=30)
    assert stack.fake.stats().count(APPROVAL) == 1  # never resent
    assert len(await stack.results(resume.id)) == 1
