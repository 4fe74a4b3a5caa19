"""The Action subject speaks AIP 1.0 (issue #25): what a live worker does with Action
Envelopes built here from the published rules alone (shared/reference/aip-1.0-wire.md
§1.1, §1.2, §2), not with the project's codec.

`tests/aip_actions.py` writes the Envelope as a dict, canonicalises it as serde_json
prints it and signs it with PyNaCl under the gateway's key: an independent implementation.
Each bad Envelope ends as one DLQ entry with its AIP code and nothing reaches Hermes; a
valid one, however it is spelled on the wire, runs.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import nacl.signing

from schemas.result import ResultStatus
from tests.aip_actions import SENDER, action_envelope, action_of, canonical, did_of, sign
from tests.aip_actions import key_of_nkey_seed as gateway_key_of
from tests.integration.stack import Stack
from worker.testing.identities import ISSUER, REVISION, USER_UNTENANTED

SCHEMA = "schema.envelope.invalid"
AUTH = "connector_host.authentication"


def _gateway_key(stack: Stack) -> nacl.signing.SigningKey:
    return gateway_key_of(stack.trust.seed)


def _envelope(operation: str = "models", input: Any = None) -> dict[str, Any]:
    """An unsigned Action Envelope for the untenanted demo principal."""
    return action_envelope(
        operation=operation, input=input, principal=USER_UNTENANTED, issuer=ISSUER,
        revision=REVISION,
    )  # fmt: skip

def _bad_envelopes(stack: Stack) -> list[tuple[str, bytes, str]]:
    """(what, bytes, the AIP code its DLQ entry must carry)."""
    gateway = _gateway_key(stack)
    cases: list[tuple[str, bytes, str]] = []

    def signed(what: str, envelope: dict[str, Any], code: str = SCHEMA) -> None:
        cases.append((what, canonical(sign(envelope, gateway)), code))

    top = _envelope()
    top["surprise"] = 1
    signed("an unknown Envelope field", top)
    in_action = _envelope()
    action_of(in_action)["surprise"] = 1
    signed("an unknown Action field", in_action)
    in_principal = _envelope()
    action_of(in_principal)["identity"]["human_actor"]["surprise"] = 1
    signed("an unknown Principal field", in_principal)
    in_callback = _envelope()
    action_of(in_callback)["callback"] = {"profile": "aip.native.nats.v1", "target": "t", "x": 1}
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
    cases.append(("no signature", canonical(unsigned), AUTH))
    malformed = sign(_envelope(), gateway)
    malformed["security"]["signature"] = "not-base64!"
    cases.append(("a malformed signature", canonical(malformed), AUTH))
    short = sign(_envelope(), gateway)
    short["security"]["signature"] = base64.b64encode(b"\0" * 32).decode()
    cases.append(("a 32-byte signature", canonical(short), AUTH))
    altered = sign(_envelope(), gateway)
    action_of(altered)["input"] = {"altered": True}
    cases.append(("a signature over other content", canonical(altered), AUTH))
    stranger = sign(_envelope(), nacl.signing.SigningKey.generate())
    cases.append(("an untrusted did:key", canonical(stranger), AUTH))
    mismatch = sign(_envelope(), gateway)
    mismatch["from"]["did"] = did_of(nacl.signing.SigningKey.generate())
    cases.append(("from.did is not security.did", canonical(mismatch), AUTH))
    return cases


async def test_each_bad_action_envelope_is_one_dlq_entry_with_its_aip_code(stack: Stack) -> None:
    await stack.spawn("w1")
    cases = _bad_envelopes(stack)
    for _, payload, _ in cases:
        await stack.publish_raw(payload)
    good = canonical(sign(_envelope(), _gateway_key(stack)))
    result = await (await stack.publish_envelope(good)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED
    await stack.settled_and_acked()
    dead = await stack.dlq()
    assert sorted(body for body, _ in dead) == sorted(payload for _, payload, _ in cases)
    entries = {body: headers for body, headers in dead}
    for what, payload, code in cases:
        headers = entries[payload]
        assert headers["code"] == code, f"{what}: {headers['code']} {headers['reason']}"
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
        "chat",
        {
            "messages": [{"role": "user", "content": text}],
            "tools": [*tools, {"type": "function", "weights": [0.1, 2.5, -3.75]}],
        },
    )
    signed = sign(envelope, _gateway_key(stack))
    reordered = dict(reversed(list(signed.items())))
    spelled = json.dumps(reordered, indent=3, ensure_ascii=True).encode()
    assert spelled != canonical(signed)
    assert b"\\u00e9" in spelled
    assert b"100.0" in spelled
    result = await (await stack.publish_envelope(spelled)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert await stack.dlq() == []
    (sent,) = [r for r in stack.fake.requests() if r.route == "POST /v1/chat/completions"]
    assert sent.body["messages"][-1]["content"] == text
    assert sent.body["tools"][0]["function"]["parameters"] == {"x": 100.0}
    assert sent.body["tools"][1]["weights"] == [0.1, 2.5, -3.75]
