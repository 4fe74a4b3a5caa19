"""Channel egress end to end: real worker processes, NATS and Redis, the fake Hermes.

A result matching `AIPD_CHANNEL_EGRESS_FILE` is sent once to
`POST /api/sessions/{session_id}/chat` as the delivery Action derived from it: never twice
under duplicate deliveries or kill -9 at any step, and an answer that may have been lost is
settled uncertain instead of posted again. Bad rule files are refused at start-up."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from schemas.chunk import DataChunk
from schemas.codec import encode
from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from worker.channel.egress import deliveries_for, delivery_id
from worker.channel.rules import load_egress_rules
from worker.testing.fake_hermes import RouteDelay, RouteError

CHAT = "POST /api/sessions/{session_id}/chat"
SESSION = "desk-session"
RULE = "desk"


def write_rules(root: Path, rules: list[dict[str, Any]], name: str = "egress.json") -> Path:
    path = root / name
    path.write_text(json.dumps(rules), encoding="utf-8")
    path.chmod(0o600)
    return path


def desk_rule(**overrides: Any) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "id": RULE,
        "match": {"capability_prefix": f"cap:hermes_agent:{ENDPOINT}:models"},
        "session_id": SESSION,
    }
    rule.update(overrides)
    return rule


async def create_session(stack: Stack, session_id: str = SESSION) -> None:
    assert stack.fake is not None
    async with httpx.AsyncClient(base_url=stack.fake.url) as http:
        answer = await http.post(
            "/api/sessions",
            json={"id": session_id},
            headers={"Authorization": f"Bearer {stack.fake.api_key}"},
        )
        assert answer.status_code == 201, answer.text


async def session_messages(stack: Stack, session_id: str = SESSION) -> list[dict[str, Any]]:
    assert stack.fake is not None
    async with httpx.AsyncClient(base_url=stack.fake.url) as http:
        answer = await http.get(
            f"/api/sessions/{session_id}/messages",
            headers={"Authorization": f"Bearer {stack.fake.api_key}"},
        )
        data: list[dict[str, Any]] = answer.json()["data"]
        return data


async def egress_stack(stack: Stack, *rules: dict[str, Any]) -> dict[str, str]:
    """The session exists and the rule file is written; returns the workers' extra env."""
    await create_session(stack)
    path = write_rules(stack.root, list(rules or [desk_rule()]))
    return {"AIPD_CHANNEL_EGRESS_FILE": str(path)}


def chats(stack: Stack) -> int:
    assert stack.fake is not None
    return stack.fake.stats().count(CHAT)


async def test_a_result_is_delivered_once_under_duplicate_deliveries(stack: Stack) -> None:
    env = await egress_stack(stack)
    await stack.spawn("w1", **env)
    await stack.spawn("w2", **env)
    source = stack.action("models")
    handle = await stack.publish(source)
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED

    delivered_id = delivery_id(RULE, source.id)
    delivered = await stack.client.handle(ENDPOINT, delivered_id).result(timeout_s=30)
    assert delivered.status is ResultStatus.COMPLETED, delivered.error
    assert delivered.capability == f"cap:hermes_agent:{ENDPOINT}:session_chat"
    chunks = await stack.chunks(delivered_id)
    assert any(isinstance(c, DataChunk) for c in chunks)  # the session's reply

    # Every kind of duplicate: the source again, the delivery message again (both past the
    # server's duplicate window, i.e. without Nats-Msg-Id).
    await stack.publish(source, dedupe=False)
    table = load_egress_rules(Path(env["AIPD_CHANNEL_EGRESS_FILE"]), [ENDPOINT])
    (delivery,) = deliveries_for(table, result, source, None)
    assert delivery.delivery_id == delivered_id
    for _ in range(3):
        await stack.nc.jetstream().publish(stack.subjects.egress(ENDPOINT), encode(delivery))
    # The same id with another message is a collision: dead-lettered, never sent.
    altered = msgspec.structs.replace(delivery, message="[AIP result] forged")
    await stack.nc.jetstream().publish(stack.subjects.egress(ENDPOINT), encode(altered))
    await stack.settled_and_acked(timeout_s=30)
    await _egress_drained(stack)

    assert chats(stack) == 1
    user_messages = [m for m in await session_messages(stack) if m["role"] == "user"]
    assert len(user_messages) == 1
    text = user_messages[0]["content"]
    assert text.startswith("[AIP result] completed")
    assert source.id in text
    assert stack.fake.api_key not in text
    assert len(await stack.results(delivered_id)) == 1
    dead = [headers.get("Aip-Dlq-Code") for _, headers in await stack.dlq()]
    assert dead == ["connector.hermes_agent.configuration_or_input"]


async def _egress_drained(stack: Stack, timeout_s: float = 30.0) -> None:
    js = stack.nc.jetstream()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        info = await js.consumer_info(
            stack.subjects.stream_name("egress"), stack.subjects.durable(ENDPOINT, "egress")
        )
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return
        assert loop.time() < deadline, info
        await asyncio.sleep(0.1)


@pytest.mark.parametrize(
    ("point", "on_delivery", "status", "posts"),
    [
        ("after_settle", False, "completed", 1),
        ("after_escalation", False, "completed", 1),
        ("after_channel_publish", False, "completed", 1),
        ("after_lease", True, "completed", 1),
        # Marked as about to send, then killed: the takeover cannot know, so it never sends.
        ("before_execute", True, "failed", 0),
        # Sent and answered, killed before settling: uncertain, never sent again.
        ("after_execute", True, "failed", 1),
        ("after_settle", True, "completed", 1),
        ("after_result_publish", True, "completed", 1),
    ],
)
async def test_kill_at_each_step_delivers_at_most_once(
    stack: Stack, point: str, on_delivery: bool, status: str, posts: int
) -> None:
    env = await egress_stack(stack)
    source = stack.action("models")
    delivered_id = delivery_id(RULE, source.id)
    target = delivered_id if on_delivery else source.id
    w1 = await stack.spawn("w1", fault_points=f"{point}=exit@{target}", **env)
    await stack.publish(source)
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    await stack.spawn("w2", **env)
    delivered = await stack.client.handle(ENDPOINT, delivered_id).result(timeout_s=60)
    assert delivered.status.value == status, delivered.error
    if status == "failed":
        assert delivered.error is not None
        assert delivered.error.code == "connector.hermes_agent.transport"
        assert delivered.error.uncertain_outcome is True
        assert delivered.error.retryable is False
    await stack.settled_and_acked(timeout_s=30)
    await _egress_drained(stack)
    assert chats(stack) == posts
    assert len(await stack.results(delivered_id)) == 1
    assert len(await stack.results(source.id)) == 1


async def test_a_lost_answer_is_settled_uncertain_and_never_posted_again(stack: Stack) -> None:
    env = await egress_stack(stack)
    assert stack.fake is not None
    stack.fake.faults.add(RouteDelay(route=CHAT, delay_s=4.0))
    w1 = await stack.spawn("w1", **env)
    source = stack.action("models")
    await stack.publish(source)
    while chats(stack) == 0:
        await asyncio.sleep(0.05)
    w1.kill()  # the answer is lost with the worker
    await stack.spawn("w2", **env)
    delivered = await stack.client.handle(ENDPOINT, delivery_id(RULE, source.id)).result(
        timeout_s=60
    )
    assert delivered.status is ResultStatus.FAILED
    assert delivered.error is not None
    assert delivered.error.uncertain_outcome is True
    await _egress_drained(stack)
    await asyncio.sleep(1.0)
    assert chats(stack) == 1


async def test_a_5xx_answer_is_uncertain_escalated_and_not_delivered_in_a_loop(
    stack: Stack,
) -> None:
    # Deliver escalations too: the failed delivery's own escalation must not be delivered.
    env = await egress_stack(stack, desk_rule(match={"capability_prefix": "cap:hermes_agent:"}))
    assert stack.fake is not None
    stack.fake.faults.add(RouteError(route=CHAT, status=500))
    await stack.spawn("w1", **env)
    source = stack.action("models")
    await stack.publish(source)
    delivered_id = delivery_id(RULE, source.id)
    delivered = await stack.client.handle(ENDPOINT, delivered_id).result(timeout_s=30)
    assert delivered.status is ResultStatus.FAILED
    assert delivered.error is not None
    assert delivered.error.code == "connector.hermes_agent.remote_temporary"
    assert delivered.error.uncertain_outcome is True
    await stack.settled_and_acked(timeout_s=30)
    await _egress_drained(stack)
    await asyncio.sleep(1.0)
    assert chats(stack) == 1
    escalated = await stack.stream_messages("escalations", stack.subjects.escalations(ENDPOINT))
    assert [msgspec.json.decode(e)["action_id"] for e in escalated] == [delivered_id]


@pytest.mark.parametrize(
    ("rules", "endpoints", "says"),
    [
        ([desk_rule(session_id="no-such-session")], None, "does not exist"),
        ([desk_rule(endpoint_id="h9")], None, "'h9' is not configured"),
        ([desk_rule()], "two", "must name both endpoint_id and session_id"),
        ([desk_rule(), desk_rule()], None, "duplicate id"),
        ([{**desk_rule(), "sessions": "x"}], None, "unknown field"),
    ],
)
async def test_bad_rule_files_are_refused_at_start_up(
    stack: Stack, rules: list[dict[str, Any]], endpoints: str | None, says: str
) -> None:
    await create_session(stack)
    path = write_rules(stack.root, rules)
    env = {"AIPD_CHANNEL_EGRESS_FILE": str(path)}
    if endpoints == "two":
        url = stack.env["AIPD_HERMES_ENDPOINTS"].split("=", 1)[1]
        env["AIPD_HERMES_ENDPOINTS"] = f"{ENDPOINT}={url},h2={url}"
        env["AIPD_HERMES_SHARE_API_KEY"] = "true"  # one Hermes behind two names
    worker = await stack.spawn("w1", wait=False, **env)
    assert await asyncio.to_thread(worker.wait_exit, 30) == 2, worker.log_tail()
    assert says in worker.log_text(), worker.log_tail()
