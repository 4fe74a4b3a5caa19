"""A refused redelivery of a request an earlier owner may have sent is uncertain.

Issue 24, finding 5: an unsafe request that had been marked as about to be sent (the
lease's `attempted_fence`), whose worker was killed, was redelivered past the replay window
and settled `connector_host.replay` with `uncertain_outcome: false, retryable: false`: a
publisher trusting that may run the work again. The refusal path now honours the attempted
fence (`worker/pipeline/answers.py` `refuse`, `worker/errors.py` `attempted_before`).
"""

from __future__ import annotations

import asyncio

import pytest

from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_terminal_chunk import assert_one_closed_stream

POST_SESSIONS = "POST /api/sessions"


@pytest.fixture
def stack_env() -> dict[str, str]:
    # A short replay window: the first delivery, fetched at once, is well inside it even on
    # a loaded machine; the redelivery, fetched only once w2 starts after it, is outside.
    return {"AIPD_MAX_ENVELOPE_AGE_MS": "5000", "AIPD_MAX_CLOCK_SKEW_MS": "0"}


async def test_a_refused_redelivery_of_an_attempted_request_is_uncertain(stack: Stack) -> None:
    """The owner recorded that it was about to send an unsafe request and was killed; its
    redelivery is refused (past the replay window), and that refusal says the outcome is
    unknown, naming the refusal."""
    action = stack.action("session_create", {})
    w1 = await stack.spawn("w1", fault_points=f"before_execute=exit@{action.id}")
    await stack.publish(action)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    await asyncio.sleep(5.5)  # the envelope is older than the window now, whenever w2 fetches
    await stack.spawn("w2")
    result = await stack.client.handle(ENDPOINT, action.id).result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.transport", result.error
    assert result.error.uncertain_outcome is True
    assert result.error.retryable is False
    assert "connector_host.replay" in result.error.message
    await stack.settled_and_acked(timeout_s=30)
    await assert_one_closed_stream(stack, action.id)
    assert stack.fake is not None
    assert stack.fake.stats().count(POST_SESSIONS) == 0
