"""A refused redelivery of a request an earlier owner may have sent is uncertain.

Issue 24, finding 5: an unsafe request that had been marked as about to be sent (the
lease's `attempted_fence`), whose worker was killed, was redelivered past the replay window
and settled `connector_host.replay` with `uncertain_outcome: false, retryable: false`: a
publisher trusting that may run the work again. The refusal path now honours the attempted
fence (`worker/pipeline/answers.py` `refuse`, `worker/errors.py` `attempted_before`).

Since issue 27 a redelivery keeps its message's stored time, so it is no longer a replay
however late it comes: the refusal here is the next worker's identity directory, which no
longer holds the Action's principal; and the late redelivery with nothing to refuse it is
settled uncertain by the runtime itself (the attempt is recorded, nothing is sent again).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest

from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_terminal_chunk import assert_one_result_without_chunks
from worker.testing.identities import USER_UNTENANTED, identity_entries, write_json

POST_SESSIONS = "POST /api/sessions"


@pytest.fixture
def stack_env() -> dict[str, str]:
    # A short replay window: the first delivery, fetched at once, is well inside it even on
    # a loaded machine; the redelivery, fetched only once w2 starts after it, is outside.
    return {"AIPD_MAX_ENVELOPE_AGE_MS": "5000", "AIPD_MAX_CLOCK_SKEW_MS": "0"}


async def _killed_after_the_attempt_mark(stack: Stack) -> str:
    action = stack.action("session_create", {})
    w1 = await stack.spawn("w1", fault_points=f"before_execute=exit@{action.id}")
    # Stamped once w1 is up (starting it may take seconds on a loaded machine): the first
    # delivery is stored well inside the short window.
    fresh = msgspec.structs.replace(action, created_at_unix_ms=time.time_ns() // 1_000_000)
    await stack.publish(fresh)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    await asyncio.sleep(5.5)  # the envelope is older than the window now, whenever w2 fetches
    return action.id


async def _uncertain(stack: Stack, action_id: str) -> str:
    result = await stack.client.handle(ENDPOINT, action_id).result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.transport", result.error
    assert result.error.uncertain_outcome is True
    assert result.error.retryable is False
    await stack.settled_and_acked(timeout_s=30)
    # session_create does not stream (as upstream AIP): the refusal is its result alone,
    # with no chunk on its subject.
    await assert_one_result_without_chunks(stack, action_id)
    assert stack.fake is not None
    assert stack.fake.stats().count(POST_SESSIONS) == 0
    return result.error.message


async def test_a_refused_redelivery_of_an_attempted_request_is_uncertain(
    stack: Stack, tmp_path: Path
) -> None:
    """The owner recorded that it was about to send an unsafe request and was killed; its
    redelivery is refused (the principal left the identity directory), and that refusal
    says the outcome is unknown, naming the refusal."""
    action_id = await _killed_after_the_attempt_mark(stack)
    entries = [e for e in identity_entries() if e["principal_id"] != USER_UNTENANTED]
    others = write_json(tmp_path / "identities-without-the-principal.json", entries)
    await stack.spawn("w2", AIPD_TRUSTED_IDENTITY_FILE=str(others))
    message = await _uncertain(stack, action_id)
    assert "connector_host.authentication" in message


async def test_a_late_redelivery_is_not_a_replay_and_is_still_uncertain(stack: Stack) -> None:
    """Past the replay window by its creation time, but stored young: not refused as a
    replay (issue 27); the recorded attempt still makes it uncertain, never sent again."""
    action_id = await _killed_after_the_attempt_mark(stack)
    await stack.spawn("w2")
    message = await _uncertain(stack, action_id)
    assert "connector_host.replay" not in message
