"""`worker.wire.channels` against the channel vectors written by hand from the rules
(tests/vectors/aip/message_envelopes.json, make_vectors.py imports nothing from worker/): the
readers take them, the writers reproduce them byte for byte, and what is not exactly a
follower's message or a delivery's `session_chat` Action is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schemas.channel import ChannelRole, ChannelSource
from schemas.errors import EnvelopeRejected, ErrorCode
from worker.aip import AipSigner
from worker.wire.actions import decode_action
from worker.wire.channels import (
    decode_delivery,
    decode_inbound,
    encode_delivery,
    encode_inbound,
)

VECTORS = json.loads(
    (Path(__file__).parents[2] / "tests/vectors/aip/message_envelopes.json").read_text("utf-8")
)["message_types"]
WORKER = AipSigner.from_seed(bytes([92]) * 32)
T0_MS = 1796083200000


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _unsigned(envelope: dict[str, Any]) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(envelope))
    del copy["security"]
    del copy["from"]["did"]
    return copy


def _egress() -> dict[str, Any]:
    (egress,) = [
        case["envelope"]
        for case in VECTORS["aip.core.v1.action"]["valid"]
        if "channel_delivery" in case["envelope"].get("extensions", {}).get(
            "org.aip-hermes-worker", {}
        )
    ]
    return dict(egress)


def test_the_inbound_vectors_decode_and_are_rewritten_byte_for_byte() -> None:
    user, tool = (case["envelope"] for case in VECTORS["aip.channel.v1.message_created"]["valid"])
    message, opened = decode_inbound(_canonical(user))
    assert opened.verified is not None
    assert opened.verified.did == WORKER.did
    assert (message.endpoint_id, message.session_id, message.message_id) == (
        "h1",
        "inbox-session",
        41,
    )
    assert message.role is ChannelRole.USER
    assert message.content == "Grüße: is the build green?"
    assert (message.timestamp, message.published_at_unix_ms) == (1796083190.5, T0_MS)
    assert encode_inbound(message, signer=WORKER) == _canonical(user)
    answer, _ = decode_inbound(_canonical(tool))
    assert (answer.role, answer.tool_call_id, answer.content) == (
        ChannelRole.TOOL,
        "call_1",
        '{"green": true}',
    )
    assert encode_inbound(answer, signer=WORKER) == _canonical(tool)


@pytest.mark.parametrize(
    ("why", "mutate"),
    [
        ("a sender other than the role's", lambda b: b.update(sender={"id": "x", "kind": "agent"})),
        ("another conversation id", lambda b: b["conversation"].update(id="conv_" + "0" * 32)),
        ("two parts", lambda b: b.update(parts=b["parts"] * 2)),
        ("a dedupe id of another message", lambda b: b["delivery"].update(dedupe_id="h1:1")),
        ("an unknown Hermes fact", lambda b: b["message"].update(model="m")),
        ("a role without its part form", lambda b: b["message"].update(role="assistant")),
    ],
)
def test_an_inbound_envelope_that_is_not_a_followers_is_refused(why: str, mutate: Any) -> None:
    envelope = _unsigned(VECTORS["aip.channel.v1.message_created"]["valid"][0]["envelope"])
    decode_inbound(_canonical(envelope))  # the unsigned original is readable
    mutate(envelope["body"]["channel_message"])
    with pytest.raises(EnvelopeRejected) as refused:
        decode_inbound(_canonical(envelope))
    assert refused.value.code is ErrorCode.SCHEMA_ENVELOPE_INVALID, why


def test_the_egress_vector_is_a_delivery_and_is_rewritten_byte_for_byte() -> None:
    egress = _egress()
    delivery, opened = decode_delivery(_canonical(egress))
    assert opened.verified is not None
    assert opened.verified.did == WORKER.did
    assert delivery.delivery_id == egress["body"]["action"]["id"]
    assert (delivery.rule_id, delivery.source, delivery.endpoint_id, delivery.session_id) == (
        "desk",
        ChannelSource.RESULT,
        "h1",
        "desk-session",
    )
    assert delivery.created_at_unix_ms == T0_MS
    assert encode_delivery(delivery, signer=WORKER) == _canonical(egress)


def test_a_delivery_is_refused_on_the_actions_subject_and_an_action_on_the_egress_queue() -> None:
    with pytest.raises(EnvelopeRejected, match="channel_delivery"):
        decode_action(_canonical(_egress()))
    plain = VECTORS["aip.core.v1.action"]["valid"][0]["envelope"]
    with pytest.raises(EnvelopeRejected, match="not a channel delivery"):
        decode_delivery(_canonical(plain))


@pytest.mark.parametrize(
    ("why", "mutate"),
    [
        ("other system message", lambda a: a["input"].update(system_message="obey")),
        ("another input key", lambda a: a["input"].update(extra=1)),
        ("a person's identity", lambda a: a.update(identity={"human_actor": {"id": "u", "kind": "human"}})),  # noqa: E501
        ("another operation", lambda a: a.update(capability_id="cap:hermes_agent:h1:chat")),
        ("a streaming mode", lambda a: a.update(mode="streaming")),
    ],
)
def test_an_egress_action_that_is_not_its_deliverys_is_refused(why: str, mutate: Any) -> None:
    envelope = _unsigned(_egress())
    decode_delivery(_canonical(envelope))
    mutate(envelope["body"]["action"])
    with pytest.raises(EnvelopeRejected) as refused:
        decode_delivery(_canonical(envelope))
    assert refused.value.code is ErrorCode.SCHEMA_ENVELOPE_INVALID, why
