"""The channel subjects read and written the way a consumer in another language would (plain
`json`, PyNaCl, the did:key rules, the exported JSON Schemas checked with `jsonschema`, and
docs/publishing.md "Channels on the wire"): nothing from the project's codec decides what is
right.

- **inbound**: every message a live follower publishes is one canonical
  `aip.channel.v1.message_created` Envelope, valid against the exported schema, signed by
  the worker's key (verified with PyNaCl), its ChannelMessage mapped as documented. An
  Envelope built by hand from those rules and signed with the worker key is read by
  `session_messages`; unsigned, wrongly keyed, altered and garbage ones on the subject
  reach no reader and do not stop the follower.
- **egress**: a delivery a live worker queues is the signed `aip.core.v1.action` Envelope
  of its `session_chat` Action, valid against the exported Action schema; deliveries built
  by hand that no trusted worker signed (unsigned, another key, altered after signing) are
  dead-lettered with `connector_host.response_signing` and post nothing.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
from typing import Any

import nacl.signing

from tests.aip_actions import canonical, key_of_nkey_seed
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_aip_escalation_wire import _signed, _validator
from tests.integration.test_aip_results_wire import _worker_did
from tests.integration.test_channel_egress import (
    ATTACK,
    RULE,
    _egress_drained,
    chats,
    egress_stack,
    session_messages,
)
from tests.integration.test_channel_egress import (
    SESSION as DESK,
)
from tests.integration.test_channel_ingress import (
    SESSION,
    fake_session,
    ingress_env,
    spoof_envelope,
    turn,
)

OURS = "org.aip-hermes-worker"
WORKER = {"id": f"agent:hermes_operator:{ENDPOINT}", "kind": "agent"}


def _hex32(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:32]


def _verified(envelope: dict[str, Any], verify_key: nacl.signing.VerifyKey) -> None:
    """§2.2 from the rules: the signature (standard base64) is over the canonical JSON of
    the Envelope without `security.signature`; raises unless `verify_key` made it."""
    unsigned = copy.deepcopy(envelope)
    signature = base64.b64decode(unsigned["security"].pop("signature"), validate=True)
    verify_key.verify(canonical(unsigned), signature)


def _sender(role: str) -> dict[str, str]:
    return {
        "user": {"id": f"contact:hermes_session:{ENDPOINT}:{SESSION}", "kind": "contact"},
        "assistant": {"id": f"agent:hermes_agent:{ENDPOINT}", "kind": "agent"},
        "tool": {"id": f"service:hermes_tool:{ENDPOINT}", "kind": "service"},
        "system": {"id": f"system:hermes_agent:{ENDPOINT}", "kind": "system"},
    }[role]


async def _inbound(stack: Stack) -> list[tuple[bytes, dict[str, str]]]:
    return await stack.stream_messages_with_headers(
        "inbound", stack.subjects.inbound(ENDPOINT, SESSION)
    )


async def test_followed_messages_are_signed_message_created_envelopes_and_forgeries_reach_no_reader(
    stack: Stack,
) -> None:
    fake_session(stack)
    turn(
        stack,
        "is the build green? ✓",
        {"role": "tool", "content": '{"green": true}', "tool_name": "ci", "tool_call_id": "c1"},
        {"role": "assistant", "content": "It is green.", "finish_reason": "stop"},
    )
    hermes = list(fake_session(stack).messages)
    await stack.spawn("w1", **ingress_env(stack))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while len(await _inbound(stack)) < len(hermes):
        assert loop.time() < deadline
        await asyncio.sleep(0.2)

    did, verify_key = _worker_did(stack)
    validator = _validator("aip.channel.v1.message_created")
    conversation = {
        "id": "conv_" + _hex32(f"hermes-agent:{ENDPOINT}:{SESSION}"),
        "channel": {"system": "hermes-agent", "endpoint_id": ENDPOINT, "session_id": SESSION},
        "status": "open",
        "external_refs": [{"system": "hermes-agent", "type": "session", "id": SESSION}],
    }
    published = await _inbound(stack)
    assert len(published) == len(hermes)
    for (data, headers), source in zip(published, hermes, strict=True):
        envelope = json.loads(data)
        assert data == canonical(envelope)
        validator.validate(envelope)
        assert envelope["message_type"] == "aip.channel.v1.message_created"
        assert envelope["from"] == {**WORKER, "did": did}
        assert envelope["security"]["did"] == did
        _verified(envelope, verify_key)
        assert not {"Aip-Signer", "Aip-Signature"} & set(headers)  # no header signatures
        assert headers["Nats-Msg-Id"] == f"{ENDPOINT}:{source['id']}"
        assert envelope["message_id"] == "msg_" + _hex32(f"inbound:{ENDPOINT}:{source['id']}")
        body = envelope["body"]["channel_message"]
        assert body["conversation"] == conversation
        assert body["sender"] == _sender(source["role"])
        content = source["content"]
        if source["role"] == "tool":
            part = {"type": "tool_result", "tool_call_id": "c1", "data": content}
        else:
            part = {"type": "text", "text": content}
        assert body["parts"] == [part]
        facts = {"id": source["id"], "role": source["role"], "timestamp": source["timestamp"]}
        for name in ("finish_reason", "tool_name", "tool_call_id"):
            if source.get(name) is not None:
                facts[name] = source[name]
        assert body["message"] == facts
        assert body["delivery"] == {
            "content_bytes": len(content.encode()),
            "content_truncated": False,
            "dedupe_id": f"{ENDPOINT}:{source['id']}",
        }
        assert "extensions" not in envelope

    # Built by hand from the rules: one signed with the worker's key (a reader takes it),
    # then forgeries: unsigned, another key, altered after signing, and garbage.
    worker_key = key_of_nkey_seed(stack.trust.worker_seed_file.read_bytes())
    by_hand = _signed(spoof_envelope(10**9, "written from the rules"), worker_key)
    validator.validate(by_hand)
    altered = _signed(spoof_envelope(10**9 + 3, "signed"), worker_key)
    altered["body"]["channel_message"]["parts"] = [{"type": "text", "text": "altered"}]
    forgeries = [
        spoof_envelope(10**9 + 1, "unsigned"),
        _signed(spoof_envelope(10**9 + 2, "another key"), nacl.signing.SigningKey.generate()),
        altered,
    ]
    js = stack.nc.jetstream()
    subject = stack.subjects.inbound(ENDPOINT, SESSION)
    for document in (by_hand, *forgeries):
        await js.publish(subject, canonical(document))
    await js.publish(subject, b"\xff not an envelope")

    read = [
        (m.message_id, m.content)
        async for m in stack.client.session_messages(ENDPOINT, SESSION, idle_timeout_s=1.0)
    ]
    assert read == [(m["id"], m["content"]) for m in hermes] + [
        (10**9, "written from the rules")
    ]

    # The follower is not frozen by any of them (the cursor is bounded by what Hermes
    # returned, and moves only on a trusted worker's Envelope): the next turn is published.
    turn(stack, "after the forgeries")
    ids = [m["id"] for m in fake_session(stack).messages]
    deadline = loop.time() + 20
    while True:
        ours = [
            json.loads(data)["body"]["channel_message"]["message"]["id"]
            for data, _ in await _inbound(stack)
            if data.startswith(b"{") and json.loads(data)["from"].get("did") == did
        ]
        ours = [hermes_id for hermes_id in ours if hermes_id < 10**9]
        if ours == ids:
            break
        assert loop.time() < deadline, (ours, ids)
        await asyncio.sleep(0.2)


async def test_a_queued_delivery_is_a_signed_session_chat_action_and_unsigned_ones_post_nothing(
    stack: Stack,
) -> None:
    env = await egress_stack(stack)
    seen: asyncio.Queue[bytes] = asyncio.Queue()

    async def keep(msg: Any) -> None:
        await seen.put(msg.data)

    copies = await stack.nc.subscribe(stack.subjects.egress(ENDPOINT), cb=keep)
    await stack.spawn("w1", **env)
    source = stack.action("models")
    await (await stack.publish(source)).result(timeout_s=30)
    delivery_id = "act_" + _hex32(f"channel:{RULE}:{source.id}")
    delivered = await stack.client.handle(ENDPOINT, delivery_id).result(timeout_s=30)
    assert delivered.status.value == "completed", delivered.error
    data = await asyncio.wait_for(seen.get(), 5)
    await copies.unsubscribe()

    envelope = json.loads(data)
    assert data == canonical(envelope)
    _validator("aip.core.v1.action").validate(envelope)
    did, verify_key = _worker_did(stack)
    assert envelope["from"] == {**WORKER, "did": did}
    _verified(envelope, verify_key)
    assert envelope["message_id"] == "msg_" + delivery_id.removeprefix("act_")
    action = envelope["body"]["action"]
    (user,) = [m for m in await session_messages(stack) if m["role"] == "user"]
    assert action["id"] == action["idempotency_key"] == delivery_id
    assert action["capability_id"] == f"cap:hermes_agent:{ENDPOINT}:session_chat"
    assert action["identity"] == {
        "service_account": {"id": "connector:hermes_channel", "kind": "service"}
    }
    assert action["input"]["session_id"] == DESK
    assert action["input"]["message"] == user["content"]  # what the session received
    assert set(action["input"]) == {"session_id", "message", "system_message"}
    assert envelope["extensions"][OURS]["channel_delivery"] == {
        "rule_id": RULE,
        "source": "result",
        "source_action_id": source.id,
        "source_id": source.id,
    }

    # Deliveries for a source that never ran, built by hand from that Envelope: unsigned,
    # signed by another key, and the worker's signature kept over altered text.
    other = "act_" + "e" * 32
    forged = copy.deepcopy(envelope)
    del forged["security"]
    del forged["from"]["did"]
    forged_id = "act_" + _hex32(f"channel:{RULE}:{other}")
    forged["message_id"] = "msg_" + forged_id.removeprefix("act_")
    forged["body"]["action"].update(id=forged_id, idempotency_key=forged_id)
    forged["body"]["action"]["input"]["message"] = ATTACK
    forged["extensions"][OURS]["channel_delivery"].update(
        source_action_id=other, source_id=other
    )
    unsigned = copy.deepcopy(forged)
    wrong_key = _signed(forged, nacl.signing.SigningKey.generate())
    altered = copy.deepcopy(envelope)
    altered["body"]["action"]["input"]["message"] = ATTACK
    js = stack.nc.jetstream()
    for document in (unsigned, wrong_key, altered):
        _validator("aip.core.v1.action").validate(document)  # only the signature refuses
        await js.publish(stack.subjects.egress(ENDPOINT), canonical(document))
    await _egress_drained(stack)

    assert chats(stack) == 1
    assert not any(ATTACK in m["content"] for m in await session_messages(stack))
    assert not await stack.results(forged_id)
    dead = [facts.get("code") for _, facts in await stack.dlq()]
    assert dead == ["connector_host.response_signing"] * 3

