"""Channel egress against both the fake and the real Hermes 0.19.0 (`route_stack`): a
result is sent into a persisted session once, and the session's own transcript shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_channel_egress import RULE, SESSION, desk_rule, write_rules
from worker.channel.egress import delivery_id
from worker.channel.normalize import END_QUOTED, NOTICE


def _hermes(stack: Stack) -> httpx.AsyncClient:
    url = stack.env["AIPD_HERMES_ENDPOINTS"].split("=", 1)[1]
    key = Path(stack.env["AIPD_HERMES_API_KEY_FILE"]).read_text(encoding="utf-8").strip()
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60.0)


async def test_a_result_is_delivered_into_the_session_and_read_back(route_stack: Stack) -> None:
    stack = route_stack
    async with _hermes(stack) as hermes:
        created = await hermes.post("/api/sessions", json={"id": SESSION})
        assert created.status_code == 201, created.text
        rules = write_rules(stack.root, [desk_rule()])
        await stack.spawn("w1", AIPD_CHANNEL_EGRESS_FILE=str(rules))
        source = stack.action("models")
        result = await (await stack.publish(source)).result(timeout_s=60)
        assert result.status is ResultStatus.COMPLETED, result.error

        delivered_id = delivery_id(RULE, source.id)
        delivered = await stack.client.handle(ENDPOINT, delivered_id).result(timeout_s=120)
        assert delivered.status is ResultStatus.COMPLETED, delivered.error
        reply = delivered.output["message"]["content"]
        assert reply
        # session_chat does not stream (as upstream AIP): the reply is the delivery's
        # result alone, and its chunk subject stays empty.
        assert delivered.last_chunk_sha256 is None
        assert await stack.chunks(delivered_id) == []

        listed = await hermes.get(f"/api/sessions/{SESSION}/messages")
        assert listed.status_code == 200, listed.text
        messages: list[dict[str, Any]] = listed.json()["data"]
    users = [m for m in messages if m["role"] == "user"]
    assert len(users) == 1
    assert users[0]["content"].startswith("[AIP result] completed")
    assert source.id in users[0]["content"]
    # Framed as quoted data, intact through Hermes' own storage (with the system_message).
    assert users[0]["content"].splitlines()[1] == NOTICE
    assert users[0]["content"].endswith(END_QUOTED)
    assert any(m["role"] == "assistant" and m["content"] == reply for m in messages)
