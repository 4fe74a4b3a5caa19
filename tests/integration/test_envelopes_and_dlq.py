"""Decode and trust (docs/architecture.md §4, steps 1-2):
bad input goes to the DLQ with its reason and
loses nothing; the consumer keeps serving the next message; nothing reaches Hermes."""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import pytest

from schemas.result import ResultStatus
from tests.integration.stack import Stack


async def test_invalid_envelopes_are_dead_lettered_with_reason_and_serving_continues(
    stack: Stack,
) -> None:
    await stack.spawn("w1", AIPD_MAX_ENVELOPE_BYTES="65536")
    good = stack.action("models")
    document = stack.envelope_document(good)

    def changed(action_id: str, **fields: object) -> dict[str, Any]:
        copied = copy.deepcopy(document)
        copied["body"]["action"]["id"] = action_id
        copied["body"]["action"].update(fields)
        return copied

    late = changed("act_" + "2" * 32)
    late["extensions"]["org.aip-hermes-worker"]["created_at_unix_ms"] = "soon"
    unknown_field = stack.sign_document(changed("act_" + "1" * 32, surprise=1))
    wrong_type = stack.sign_document(late)
    over_size = stack.sign_document(changed("act_" + "3" * 32, input={"blob": "x" * 100_000}))
    not_json = b"\xff\xfe{definitely not json"
    for payload in (unknown_field, wrong_type, over_size, not_json):
        await stack.publish_raw(payload)
    handle = await stack.publish(good)

    result = await handle.result(timeout_s=20)
    assert result.status is ResultStatus.COMPLETED
    await stack.settled_and_acked()
    dead = await stack.dlq()
    # Small refusals are kept whole; a larger one keeps its first 4 KiB (issue 19).
    assert [body for body, _ in dead] == [unknown_field, wrong_type, over_size[:4096], not_json]
    codes = [headers["code"] for _, headers in dead]
    # Bytes over the limit are refused before they are parsed (`envelope.decode.invalid`).
    assert codes == [
        "schema.envelope.invalid",
        "schema.envelope.invalid",
        "envelope.decode.invalid",
        "envelope.decode.invalid",
    ]
    reasons = [headers["reason"] for _, headers in dead]
    assert "surprise" in reasons[0]
    assert "created_at_unix_ms" in reasons[1]
    assert "limit" in reasons[2]
    assert all(h["subject"] == "aip.hermes.h1.actions" for _, h in dead)
    assert stack.fake.stats().count("GET /v1/models") == 1


@pytest.mark.aip_family("identity_credentials", assertions=["transport_actor_bound"])
async def test_unsigned_and_forged_envelopes_never_reach_hermes_nor_touch_the_action_id(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    victim = stack.action("models")
    await stack.publish(victim, msg_id="unsigned-copy", signed=False)
    # The genuine signature over another input: it does not verify over this Envelope.
    forged = json.loads(stack.trust.seal_action(victim))
    forged["body"]["action"]["input"] = {"forged": True}
    await stack.nc.jetstream().publish(
        stack.subjects.actions("h1"),
        json.dumps(forged).encode(),
        headers={"Nats-Msg-Id": "forged"},
    )
    await stack.settled_and_acked()
    codes = [h["code"] for _, h in await stack.dlq()]
    assert codes == ["connector_host.authentication", "connector_host.authentication"]
    assert await stack.results(victim.id) == []
    assert stack.fake.stats().count("GET /v1/models") == 0
    # The genuine envelope with the same id still runs: nothing was recorded for it.
    result = await (await stack.publish(victim)).result(timeout_s=20)
    assert result.status is ResultStatus.COMPLETED


async def test_refused_identity_settles_one_failed_result_without_a_provider_request(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    stranger = stack.action("models", principal_id="user:mallory")
    result = await (await stack.publish(stranger)).result(timeout_s=20)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector_host.authentication"
    assert result.error.retryable is False
    assert stack.fake.stats().count("GET /v1/models") == 0
    # A non-streaming capability: the refusal is its result alone, with no chunk.
    assert await stack.chunks(stranger.id) == []
    assert result.last_chunk_sha256 is None


async def test_an_unsafe_action_without_idempotency_key_is_refused_before_hermes(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    action = stack.action("session_create", {})
    action = msgspec.structs.replace(action, idempotency_key=None)
    result = await (await stack.publish(action)).result(timeout_s=20)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.configuration_or_input"
    assert "idempotency_key" in result.error.message
    assert stack.fake.stats().count("POST /api/sessions") == 0
