"""A read whose retry policy is spent, end to end (real worker processes, NATS, Redis, the
fake Hermes over HTTP; docs/publishing.md "The dead-letter queue"): its one failed result
stays retryable, and the Action has exactly one DLQ entry, the signed `action_status`
Envelope in state `dead_lettered` every entry is, with the reference runtime's
`ActionStatus.retry` (attempts, policy, last error, reason). Read here by hand (plain
`json`, `base64`, PyNaCl over the canonical bytes rebuilt by hand, the exported schema):
the project's codec decides nothing.

- one entry and one result, and as many Hermes calls as the entry says attempts;
- a worker killed after the entry, or after the settle before it, leaves one entry: the
  next owner republishes it from the stored result under the same id;
- a definitive failure and an unsafe operation (never retried) leave none.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
from typing import Any

import pytest

from schemas.action import Action
from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_aip_dlq_wire import OURS, STATUS, _validator
from tests.integration.test_aip_results_wire import _canonical, _worker_did
from tests.integration.test_dlq_commands import cli
from worker.testing.fake_hermes import RouteError

READ = "GET /v1/skills"
RETRIES = 2  # AIPD_HERMES_READ_RETRY_ATTEMPTS of the workers below
ATTEMPTS = 1 + RETRIES


async def _entries(stack: Stack) -> list[dict[str, Any]]:
    """Every DLQ message as its Envelope, each checked from the rules: canonical JSON,
    valid against the exported schema, signed by the worker's key, the entry's id its
    `message_id`."""
    did, verify_key = _worker_did(stack)
    out = []
    for data in await stack.stream_messages("dlq", stack.subjects.dlq(ENDPOINT)):
        envelope = json.loads(data)
        assert data == _canonical(envelope)
        assert [e.message for e in _validator().iter_errors(envelope)] == []
        assert envelope["message_type"] == STATUS
        assert envelope["security"]["did"] == envelope["from"]["did"] == did
        unsigned = copy.deepcopy(envelope)
        signature = base64.b64decode(unsigned["security"].pop("signature"), validate=True)
        verify_key.verify(_canonical(unsigned), signature)  # raises if it does not verify
        facts = envelope["extensions"][OURS]["dead_letter"]
        assert envelope["message_id"] == "msg_" + facts["dlq_id"].removeprefix("dlq_")
        out.append(envelope)
    return out


def _check_exhausted(envelope: dict[str, Any], action: Action) -> None:
    """The entry of `action`'s spent policy: its status, retry facts and kept Action."""
    action_id = action.id
    status = envelope["body"]["action_status"]
    assert (status["action_id"], status["state"]) == (action_id, "dead_lettered")
    assert status["capability_id"] == action.capability
    assert status["result_status"] == "failed"
    retry = status["retry"]
    assert retry["attempts"] == ATTEMPTS == retry["policy"]["max_attempts"]
    assert retry["policy"]["backoff_multiplier"] == 2
    assert retry["dead_letter_reason"] == "retry_policy_exhausted"
    last = retry["last_error"]
    assert (last["code"], last["retryable"]) == ("connector.hermes_agent.remote_temporary", True)
    assert last["details"]["remote_status"] == 500
    facts = envelope["extensions"][OURS]["dead_letter"]
    assert facts["code"] == "connector.hermes_agent.remote_temporary"
    assert facts["subject"] == f"aip.hermes.{ENDPOINT}.actions"
    kept = base64.b64decode(facts["kept"], validate=True)
    assert (facts["size"], facts["sha256"]) == (len(kept), hashlib.sha256(kept).hexdigest())
    assert json.loads(kept)["body"]["action"]["id"] == action_id  # what `dlq replay` sends


@pytest.mark.aip_family("retry_exhaustion", assertions=["exhaustion_dead_lettered"])
async def test_a_read_that_spends_its_retry_policy_is_dead_lettered_once(stack: Stack) -> None:
    assert stack.fake is not None
    stack.fake.faults.add(RouteError(route=READ, status=500, times=None))
    await stack.spawn("w1", AIPD_HERMES_READ_RETRY_ATTEMPTS=str(RETRIES))
    action = stack.action("skills")
    result = await (await stack.publish(action)).result(timeout_s=30)
    await stack.settled_and_acked()

    # The one failed result is as it always was: retryable, certain.
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert (result.error.retryable, result.error.uncertain_outcome) == (True, False)
    assert len(await stack.results(action.id)) == 1

    (entry,) = await _entries(stack)
    _check_exhausted(entry, action)
    assert stack.fake.stats().count(READ) == ATTEMPTS

    dlq_id = entry["extensions"][OURS]["dead_letter"]["dlq_id"]
    code, out, err = await cli(stack, "dlq", "show", dlq_id, "--endpoint", ENDPOINT)
    assert code == 0, err
    shown = json.loads(out)  # shown only because a trusted worker key signed it
    assert (shown["action_id"], shown["retry"]["attempts"]) == (action.id, ATTEMPTS)
    receipts = [r for r in await stack.receipts(action.id) if r.event.value == "dead_lettered"]
    assert [r.details.get("dlq_id") for r in receipts] == [dlq_id]


@pytest.mark.parametrize("point", ["after_settle", "after_exhaustion_dead_letter"])
async def test_a_crash_around_the_entry_leaves_exactly_one(stack: Stack, point: str) -> None:
    assert stack.fake is not None
    stack.fake.faults.add(RouteError(route=READ, status=500, times=None))
    action = stack.action("skills")
    w1 = await stack.spawn(
        "w1", fault_points=f"{point}=exit@{action.id}", AIPD_HERMES_READ_RETRY_ATTEMPTS="2"
    )
    handle = await stack.publish(action)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    await stack.spawn("w2", AIPD_HERMES_READ_RETRY_ATTEMPTS=str(RETRIES))
    result = await handle.result(timeout_s=60)
    await stack.settled_and_acked(timeout_s=30)

    assert result.status is ResultStatus.FAILED
    assert result.settled_by == "w1"  # w2 found it settled and only republished
    assert len(await stack.results(action.id)) == 1
    (entry,) = await _entries(stack)
    _check_exhausted(entry, action)
    assert entry["extensions"][OURS]["dead_letter"]["worker_id"] == "w1"
    assert stack.fake.stats().count(READ) == ATTEMPTS


async def test_no_entry_without_a_spent_policy(stack: Stack) -> None:
    assert stack.fake is not None
    stack.fake.faults.add(RouteError(route="POST /api/sessions", status=500, times=None))
    await stack.spawn("w1", AIPD_HERMES_READ_RETRY_ATTEMPTS=str(RETRIES))
    unsafe = stack.action("session_create")
    rejected = stack.action("run_status", {"run_id": "run_" + "0" * 32})  # Hermes: 404
    first = await (await stack.publish(unsafe)).result(timeout_s=30)
    second = await (await stack.publish(rejected)).result(timeout_s=30)
    await stack.settled_and_acked()

    assert first.error is not None
    assert second.error is not None
    assert (first.error.uncertain_outcome, first.error.retryable) == (True, False)
    assert second.error.code.value == "connector.hermes_agent.remote_rejected"
    assert stack.fake.stats().count("POST /api/sessions") == 1
    assert await _entries(stack) == []
