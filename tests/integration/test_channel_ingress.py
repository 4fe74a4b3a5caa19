"""Channel ingress end to end: real worker processes, NATS and Redis, the fake Hermes (and
the real Hermes 0.19.0 in the last test). Every message of a followed session is published
once, in id order, across worker kills, competing followers and a Hermes restart; hostile
content is bounded or refused (dead-lettered and counted), never guessed. A message forged
on the inbound subject (an `aip.channel.v1.message_created` Envelope built here from the
rules, unsigned or signed by a key no worker trusts) neither moves the cursor (a spoofed
Hermes id of 10^12 does not freeze the session) nor reaches a reader that verifies the
workers' signatures."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import nacl.signing
import pytest

from schemas.channel import MAX_INGRESS_CONTENT_BYTES, ChannelMessage
from tests.aip_actions import canonical
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_aip_escalation_wire import _signed
from worker.testing.fake_hermes import RouteError
from worker.wire.channels import decode_inbound

SESSION = "inbox-session"
MESSAGES = "GET /api/sessions/{session_id}/messages"


def ingress_env(stack: Stack, **rule: Any) -> dict[str, str]:
    path = stack.root / "ingress.json"
    path.write_text(
        json.dumps([{"session_id": SESSION, "poll_interval_ms": 200, **rule}]), encoding="utf-8"
    )
    path.chmod(0o600)
    return {"AIPD_CHANNEL_INGRESS_FILE": str(path)}


def fake_session(stack: Stack) -> Any:
    assert stack.fake is not None
    return stack.fake.state.sessions.ensure(SESSION)


def turn(stack: Stack, user_text: str, *replies: dict[str, Any]) -> None:
    """One agent turn recorded in the fake's state.db (as a chat would)."""
    assert stack.fake is not None
    stack.fake.state.sessions.record_turn(
        SESSION, user_text, list(replies) or [{"role": "assistant", "content": "ok"}], None, "m"
    )


async def published(stack: Stack) -> list[tuple[ChannelMessage, dict[str, str]]]:
    """Every message on the session's subject, decoded (signatures verified when present;
    which key signed is checked where it matters)."""
    return [
        (decode_inbound(data)[0], headers)
        for data, headers in await stack.stream_messages_with_headers(
            "inbound", stack.subjects.inbound(ENDPOINT, SESSION)
        )
    ]


def spoof_envelope(hermes_id: int, text: str) -> dict[str, Any]:
    """A `message_created` Envelope as anyone with publish rights on the subject could
    write it from docs/publishing.md "Channels on the wire": plain dicts, unsigned."""
    import hashlib

    def hex32(seed: str) -> str:
        return hashlib.sha256(seed.encode()).hexdigest()[:32]

    return {
        "aip_version": "1.0",
        "message_type": "aip.channel.v1.message_created",
        "message_id": "msg_" + hex32(f"inbound:{ENDPOINT}:{hermes_id}"),
        "sent_at": "2026-12-01T00:00:00Z",
        "from": {"id": f"agent:hermes_operator:{ENDPOINT}", "kind": "agent"},
        "body": {
            "channel_message": {
                "conversation": {
                    "id": "conv_" + hex32(f"hermes-agent:{ENDPOINT}:{SESSION}"),
                    "channel": {
                        "system": "hermes-agent",
                        "endpoint_id": ENDPOINT,
                        "session_id": SESSION,
                    },
                    "status": "open",
                    "external_refs": [
                        {"system": "hermes-agent", "type": "session", "id": SESSION}
                    ],
                },
                "sender": {
                    "id": f"contact:hermes_session:{ENDPOINT}:{SESSION}",
                    "kind": "contact",
                },
                "parts": [{"type": "text", "text": text}],
                "message": {"id": hermes_id, "role": "user"},
                "delivery": {
                    "content_bytes": len(text.encode()),
                    "content_truncated": False,
                    "dedupe_id": f"{ENDPOINT}:{hermes_id}",
                },
            }
        },
    }


async def wait_published(stack: Stack, count: int, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while len(await published(stack)) < count:
        assert loop.time() < deadline, [m.message_id for m, _ in await published(stack)]
        await asyncio.sleep(0.2)


async def test_every_message_once_across_a_worker_kill_and_a_hermes_restart(
    stack: Stack,
) -> None:
    assert stack.fake is not None
    fake_session(stack)
    for n in range(3):
        turn(stack, f"question {n}")
    ids = [m["id"] for m in fake_session(stack).messages]
    env = ingress_env(stack)
    # w1 dies right after publishing the third message, before it moves the cursor.
    w1 = await stack.spawn(
        "w1", fault_points=f"after_ingress_publish=exit@{SESSION}:{ids[2]}", **env
    )
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    assert [m.message_id for m, _ in await published(stack)] == ids[:3]

    await stack.fake.restart()
    turn(stack, "after the restart")
    # Two followers compete for the session from now on.
    await stack.spawn("w2", **env)
    await stack.spawn("w3", **env)
    turn(stack, "with two followers")
    ids = [m["id"] for m in fake_session(stack).messages]
    await wait_published(stack, len(ids))
    await asyncio.sleep(2.0)  # time for a duplicate to show up, if any would

    found = await published(stack)
    assert [m.message_id for m, _ in found] == ids
    assert [h["Nats-Msg-Id"] for _, h in found] == [f"{ENDPOINT}:{i}" for i in ids]
    by_id = {m["id"]: m for m in fake_session(stack).messages}
    for message, _ in found:
        assert message.role.value == by_id[message.message_id]["role"]
        assert message.content == by_id[message.message_id]["content"]
        assert message.session_id == SESSION
        assert message.content_truncated is False
    # What a consumer sees through the client: the same messages, once, in order.
    read = [
        m.message_id
        async for m in stack.client.session_messages(ENDPOINT, SESSION, idle_timeout_s=1.0)
    ]
    assert read == ids
    later = stack.client.session_messages(
        ENDPOINT, SESSION, after_message_id=ids[2], idle_timeout_s=1.0
    )
    assert [m.message_id async for m in later] == ids[3:]


async def test_hostile_content_is_bounded_or_refused_and_nothing_after_it_is_lost(
    stack: Stack,
) -> None:
    assert stack.fake is not None
    fake_session(stack)
    huge = "é" * 150_000  # 300 000 bytes of UTF-8
    turn(
        stack,
        huge,
        {"role": "wizard", "content": "an odd role"},
        {"role": "assistant", "content": {"not": "text"}},
        {"role": "tool", "content": '{"unterminated": ', "tool_name": "terminal"},
        {"role": "assistant", "content": "still here"},
    )
    # The first polls fail outright: retried, nothing advanced.
    stack.fake.faults.add(RouteError(route=MESSAGES, status=500, times=3))
    await stack.spawn("w1", **ingress_env(stack))
    await wait_published(stack, 3)
    await asyncio.sleep(1.5)

    found = [m for m, _ in await published(stack)]
    assert [m.role.value for m in found] == ["user", "tool", "assistant"]
    user, tool, last = found
    assert user.content_truncated is True
    assert user.content_bytes == 300_000
    assert len(user.content.encode()) <= MAX_INGRESS_CONTENT_BYTES
    assert tool.content == '{"unterminated": '  # passed as text, never parsed
    assert last.content == "still here"
    dead = [
        (headers["code"], headers["reason"]) for _, headers in await stack.dlq()
    ]
    assert len(dead) == 2, dead
    assert {code for code, _ in dead} == {"schema.envelope.invalid"}
    assert any("unknown role" in reason for _, reason in dead)
    assert any("`content` is not a string" in reason for _, reason in dead)
    assert stack.fake.stats().count(MESSAGES) >= 4


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ({"session_id": "no-such-session"}, "does not exist"),
        ({"session_id": "dotted.session"}, "session_id"),
        ({"endpoint_id": "h9"}, "'h9' is not configured"),
    ],
)
async def test_bad_ingress_files_are_refused_at_start_up(
    stack: Stack, rule: dict[str, Any], says: str
) -> None:
    fake_session(stack)
    worker = await stack.spawn("w1", wait=False, **ingress_env(stack, **rule))
    assert await asyncio.to_thread(worker.wait_exit, 30) == 2, worker.log_tail()
    assert says in worker.log_text(), worker.log_tail()


async def test_a_real_session_is_followed_once(route_stack: Stack) -> None:
    stack = route_stack
    url = stack.env["AIPD_HERMES_ENDPOINTS"].split("=", 1)[1]
    key = Path(stack.env["AIPD_HERMES_API_KEY_FILE"]).read_text(encoding="utf-8").strip()
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120.0
    ) as hermes:
        created = await hermes.post("/api/sessions", json={"id": SESSION})
        assert created.status_code == 201, created.text
        chat = await hermes.post(f"/api/sessions/{SESSION}/chat", json={"message": "hello"})
        assert chat.status_code == 200, chat.text
        await stack.spawn("w1", **ingress_env(stack))
        transcript = (await hermes.get(f"/api/sessions/{SESSION}/messages")).json()["data"]
        await wait_published(stack, len(transcript), timeout_s=60)
        chat = await hermes.post(f"/api/sessions/{SESSION}/chat", json={"message": "again"})
        assert chat.status_code == 200, chat.text
        transcript = (await hermes.get(f"/api/sessions/{SESSION}/messages")).json()["data"]
    await wait_published(stack, len(transcript), timeout_s=60)
    await asyncio.sleep(1.0)
    found = [m for m, _ in await published(stack)]
    assert [m.message_id for m in found] == [m["id"] for m in transcript]
    assert [m.content for m in found] == [m["content"] or "" for m in transcript]


async def test_a_spoofed_message_id_on_the_subject_neither_freezes_ingress_nor_reaches_readers(
    stack: Stack,
) -> None:
    fake_session(stack)
    turn(stack, "before the spoof")
    await stack.spawn("w1", **ingress_env(stack))
    await wait_published(stack, 2)
    for data in await stack.stream_messages("inbound", stack.subjects.inbound(ENDPOINT, SESSION)):
        assert "signature" in json.loads(data)["security"]  # every follower message is signed

    # Anyone with publish rights on the subject: schema-valid Envelopes with huge Hermes
    # ids, one unsigned and one signed by a key no worker trusts.
    attacker = nacl.signing.SigningKey.generate()
    subject = stack.subjects.inbound(ENDPOINT, SESSION)
    for message_id, signer in ((10**12, None), (10**12 + 1, attacker)):
        spoof = spoof_envelope(message_id, "spoofed")
        if signer is not None:
            spoof = _signed(spoof, signer)
        headers = {"Nats-Msg-Id": f"{ENDPOINT}:{message_id}"}
        await stack.nc.jetstream().publish(subject, canonical(spoof), headers=headers)
    await asyncio.sleep(1.0)  # several polls with the spoof last on the subject

    turn(stack, "after the spoof")
    ids = [m["id"] for m in fake_session(stack).messages]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        real = [m.message_id for m, _ in await published(stack) if m.content != "spoofed"]
        if real == ids:
            break
        assert loop.time() < deadline, (real, ids)
        await asyncio.sleep(0.2)
    # A reader holding the trusted worker keys sees the real messages only, in order.
    read = [
        m.message_id
        async for m in stack.client.session_messages(ENDPOINT, SESSION, idle_timeout_s=1.0)
    ]
    assert read == ids
