"""A refused DelegationRequest under a genuine delegation id does not burn it (issue 24,
medium: "a refused envelope under an approved id burns it", for delegations).

Worker processes, real NATS and Redis, the fake Hermes and the real AIP gateway, as in
test_delegation_through_workers.py. A key holder publishes first, under the genuine
request's `delegation_id` (so under its derived Action id), a request naming another child
that nobody approved: it is refused (the durable approval of the exact child) and settled
`refused` under the delegation's Action id. The genuine request, whose child was approved,
then clears that refusal and runs once (`worker/store/lua/lease_acquire.lua`, the same
pipeline as an Action: `worker/pipeline/answers.py` `refuse`).
"""

from __future__ import annotations

import msgspec

from schemas.result import ResultStatus
from worker.delegation import delegation_action_id

from .conftest import DelegationStack

POST_RUNS = "POST /v1/runs"


async def test_a_refused_forgery_first_leaves_the_delegation_id_to_the_genuine_request(
    dstack: DelegationStack,
) -> None:
    await dstack.stack.spawn("w1")
    genuine = dstack.request()
    forged = msgspec.structs.replace(
        genuine, action=msgspec.structs.replace(genuine.action, input={"case_id": "forged"})
    )
    refusal = await (await dstack.delegate(forged, approve=False)).result(timeout_s=30)
    assert refusal.status is ResultStatus.FAILED
    assert refusal.error is not None
    assert "approval" in refusal.error.code
    assert dstack.fake.stats().count(POST_RUNS) == 0

    handle = await dstack.delegate(genuine)
    assert handle.action_id == delegation_action_id(genuine.delegation_id)
    assert not handle.duplicate
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert dstack.fake.stats().count(POST_RUNS) == 1
    assert await dstack.stack.dlq() == []  # no collision: the refusal held nothing of the id
