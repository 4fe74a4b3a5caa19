"""The Action subject speaks AIP 1.0 (issue #25): what a live worker does with Action
Envelopes built here from the published rules alone (shared/reference/aip-1.0-wire.md
§1.1, §1.2, §2), not with the project's codec.

The builder below writes the Envelope as a dict, canonicalises it as serde_json prints
(sorted keys, no whitespace, UTF-8 as is; the values used here print the same in Python's
`json`), and signs it with PyNaCl under the gateway's key: an independent implementation.
Each bad Envelope ends as one DLQ entry with its AIP code and nothing reaches Hermes; a
valid one, however it is spelled on the wire, runs.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
from datetime import UTC, datetime
from typing import Any

import nacl.signing
import nkeys

from schemas.dlq import DLQ_CODE, DLQ_REASON
from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.testing.identities import ISSUER, REVISION, USER_UNTENANTED

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
SCHEMA = "schema.envelope.invalid"
AUTH = "connector_host.authentication"
SENDER = {"id": "service:test-gateway", "kind": "service"}


def _b58(data: bytes) -> str:
    number, out = int.from_bytes(data, "big"), ""
    while number:
        number, rest = divmod(number, 58)
        out = _B58[rest] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def _did(key: nacl.signing.SigningKey) -> str:
    return "did:key:z" + _b58(b"\xed\x01" + bytes(key.verify_key))


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _gateway_key(stack: Stack) -> nacl.signing.SigningKey:
    _, raw = nkeys.decode_seed(bytearray(stack.trust.seed))
    return nacl.signing.SigningKey(bytes(raw))


def _envelope(operation: str = "models", input: Any = None) -> dict[str, Any]:
    """An unsigned Action Envelope for the untenanted demo principal, by §1.1 and §1.2."""
    action_id = "act_" + secrets.token_hex(16)
    return {
        "aip_version": "1.0",
        "message_type": "aip.core.v1.action",
        "message_id": "msg_" + secrets.token_hex(16),
        "sent_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "body": {
            "action": {
                "id": action_id,
                "capability_id": f"cap:hermes_agent:h1:{operation}",
                "input": {} if input is None else input,
                "mode": "async",
                "idempotency_key": action_id,
                "identity": {
                    "human_actor": {
                        "id": USER_UNTENANTED,
                        "kind": "human",
                        "auth_context": {
                            "issuer": ISSUER,
                            "credential_revision": REVISION,
                            "principal_kind": "user",
                        },
                    }
                },
            }
        },
    }


def _sign(envelope: dict[str, Any], key: nacl.signing.SigningKey) -> dict[str, Any]:
    """§2.2: `from` and `security.did` name the key; the signature (standard base64,
    padded) covers the canonical Envelope without `security.signature`."""
    signed = copy.deepcopy(envelope)
    did = _did(key)
    signed["from"] = {**SENDER, "did": did}
    signed["security"] = {"did": did}
    signature = key.sign(_canonical(signed)).signature
    signed["security"]["signature"] = base64.b64encode(signature).decode()
    return signed


def _action(envelope: dict[str, Any]) -> dict[str, Any]:
    action: dict[str, Any] = envelope["body"]["action"]
    return action


def _bad_envelopes(stack: Stack) -> list[tuple[str, bytes, str]]:
    """(what, bytes, the AIP code its DLQ entry must carry)."""
    gateway = _gateway_key(stack)
    cases: list[tuple[str, bytes, str]] = []

    def signed(what: str, envelope: dict[str, Any], code: str = SCHEMA) -> None:
        cases.append((what, _canonical(_sign(envelope, gateway)), code))

    top = _envelope()
    top["surprise"] = 1
    signed("an unknown Envelope field", top)
    in_action = _envelope()
    _action(in_action)["surprise"] = 1
    signed("an unknown Action field", in_action)
    in_principal = _envelope()
    _action(in_principal)["identity"]["human_actor"]["surprise"] = 1
    signed("an unknown Principal field", in_principal)
    in_callback = _envelope()
    _action(in_callback)["callback"] = {"profile": "aip.native.nats.v1", "target": "t", "x": 1}
    signed("an unknown field in a typed nested object", in_callback)
    in_extension = _envelope()
    in_extension["extensions"] = {"org.aip-hermes-worker": {"surprise": 1}}
    signed("an unknown key in our extension", in_extension)
    other_key = _envelope()
    other_key["body"] = {"cancel": other_key["body"]["action"]}
    signed("a body key that is not `action`", other_key)
    two_keys = _envelope()
    two_keys["body"]["note"] = {}
    signed("a body with two keys", two_keys)
    version = _envelope()
    version["aip_version"] = "1.1"
    signed("aip_version 1.1", version)
    version_number = _envelope()
    version_number["aip_version"] = 1.0
    signed("aip_version as a number", version_number)

    unsigned = _envelope()
    unsigned["from"] = dict(SENDER)
    cases.append(("no signature", _canonical(unsigned), AUTH))
    malformed = _sign(_envelope(), gateway)
    malformed["security"]["signature"] = "not-base64!"
    cases.append(("a malformed signature", _canonical(malformed), AUTH))
    short = _sign(_envelope(), gateway)
    short["security"]["signature"] = base64.b64encode(b"\0" * 32).decode()
    cases.append(("a 32-byte signature", _canonical(short), AUTH))
    altered = _sign(_envelope(), gateway)
    _action(altered)["input"] = {"altered": True}
    cases.append(("a signature over other content", _canonical(altered), AUTH))
    stranger = _sign(_envelope(), nacl.signing.SigningKey.generate())
    cases.append(("an untrusted did:key", _canonical(stranger), AUTH))
    mismatch = _sign(_envelope(), gateway)
    mismatch["from"]["did"] = _did(nacl.signing.SigningKey.generate())
    cases.append(("from.did is not security.did", _canonical(mismatch), AUTH))
    return cases


async def test_each_bad_action_envelope_is_one_dlq_entry_with_its_aip_code(stack: Stack) -> None:
    await stack.spawn("w1")
    cases = _bad_envelopes(stack)
    for _, payload, _ in cases:
        await stack.publish_raw(payload)
    good = _canonical(_sign(_envelope(), _gateway_key(stack)))
    result = await (await stack.publish_envelope(good)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED
    await stack.settled_and_acked()
    dead = await stack.dlq()
    assert sorted(body for body, _ in dead) == sorted(payload for _, payload, _ in cases)
    entries = {body: headers for body, headers in dead}
    for what, payload, code in cases:
        headers = entries[payload]
        assert headers[DLQ_CODE] == code, f"{what}: {headers[DLQ_CODE]} {headers[DLQ_REASON]}"
    for what, payload, _ in cases:
        try:
            action_id = json.loads(payload)["body"].get("action", {}).get("id")
        except (ValueError, AttributeError):
            continue
        if isinstance(action_id, str):
            assert await stack.results(action_id) == [], what
    assert stack.fake.stats().count("GET /v1/models") == 1  # the good one only


async def test_a_valid_envelope_verifies_whatever_its_json_spelling(stack: Stack) -> None:
    """Keys in another order, whitespace, `\\u` escapes for non-ASCII text, and floats and
    non-ASCII strings in `input`: the signature is over the canonical form, not the bytes."""
    await stack.spawn("w1")
    text = "café ✓ 日本語 \U0001f600"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"x": 100.0}}}]
    envelope = _envelope(
        "chat_completions",
        {
            "messages": [{"role": "user", "content": text}],
            "tools": [*tools, {"type": "function", "weights": [0.1, 2.5, -3.75]}],
        },
    )
    signed = _sign(envelope, _gateway_key(stack))
    reordered = dict(reversed(list(signed.items())))
    spelled = json.dumps(reordered, indent=3, ensure_ascii=True).encode()
    assert spelled != _canonical(signed)
    assert b"\\u00e9" in spelled
    assert b"100.0" in spelled
    result = await (await stack.publish_envelope(spelled)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert await stack.dlq() == []
    (sent,) = [r for r in stack.fake.requests() if r.route == "POST /v1/chat/completions"]
    assert sent.body["messages"][-1]["content"] == text
    assert sent.body["tools"][0]["function"]["parameters"] == {"x": 100.0}
    assert sent.body["tools"][1]["weights"] == [0.1, 2.5, -3.75]
