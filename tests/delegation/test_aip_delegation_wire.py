"""The delegations subject speaks AIP 1.0 (issue #25): a DelegationRequest Envelope built
here from the published rules alone (shared/reference/aip-1.0-wire.md §1.1, §1.12, §2;
docs/publishing.md "DelegationRequest") — a dict, canonicalised as serde_json prints it,
signed with PyNaCl under the gateway's key — runs on a live worker, and every answer is
checked from the rules too: the exported JSON Schemas (validated with `jsonschema`) and
Ed25519 over the canonical JSON (PyNaCl), nothing from the project's codec.

Checked along the way: the child Action the gateway sends to a non-Hermes route (the echo
executor) is the same signed `aip.core.v1.action` Envelope a Hermes worker gets, and the
executor's answer a signed `aip.core.v1.action_result`; the delegation's own signed
result carries the AIP DelegationResult in `output.delegation_result`."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
from datetime import UTC, datetime
from typing import Any

import nacl.signing
from jsonschema import Draft202012Validator

from schemas.export import JSON_DIR
from tests.aip_actions import b58, canonical, did_of, key_of_nkey_seed, sign
from tests.delegation.support import CHILD_CAPABILITY, DELEGATOR, ISSUER
from worker.testing.echo_capability import SANDBOX_SUBJECT_PREFIX

from .conftest import DelegationStack

DELEGATE = "agent:hermes_operator:h1"
#: docs/publishing.md: the delegation runs under `act_` + 32 hex of
#: sha256("aip-hermes-worker/delegation/v1\0" || delegation_id).
DOMAIN = b"aip-hermes-worker/delegation/v1\x00"


def _validator(message_type: str) -> Draft202012Validator:
    schema = json.loads((JSON_DIR / f"{message_type}.json").read_text("utf-8"))
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _b58decode(text: str) -> bytes:
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    number = 0
    for char in text:
        number = number * 58 + alphabet.index(char)
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return b"\0" * (len(text) - len(text.lstrip("1"))) + raw


def _verified(data: bytes, message_type: str, *, any_capability: bool = False) -> dict[str, Any]:
    """The Envelope in `data`, valid against the exported schema of `message_type`, whose
    signature verifies with the did:key it names (§2.2-§2.5, by hand). Returns it.

    `any_capability`: an Action for another route than a Hermes endpoint's; the actions
    subject's schema also pins `capability_id` to Hermes endpoints, so that one rule is
    checked with a Hermes id in its place (everything else as sent)."""
    envelope: dict[str, Any] = json.loads(data)
    checked = json.loads(data)
    if any_capability:
        checked["body"]["action"]["capability_id"] = "cap:hermes_agent:h1:models"
    errors = sorted(_validator(message_type).iter_errors(checked), key=str)
    assert not errors, [error.message for error in errors][:3]
    assert envelope["message_type"] == message_type
    security = dict(envelope["security"])
    did = security["did"]
    assert envelope["from"]["did"] == did
    multikey = _b58decode(did.removeprefix("did:key:z"))
    assert multikey[:2] == b"\xed\x01"
    assert b58(multikey) == did.removeprefix("did:key:z")
    signature = base64.b64decode(security.pop("signature"), validate=True)
    unsigned = {**envelope, "security": security}
    nacl.signing.VerifyKey(multikey[2:]).verify(canonical(unsigned), signature)
    return envelope


def _rfc3339_as_signed(moment: datetime) -> str:
    """`moment` (UTC) as the reference verifier re-renders a timestamp before it checks a
    signature (aip-1.0-wire.md §2.2, "Consequences for a non-Rust signer"): `Z`, and
    fractional seconds only when non-zero, trailing zeros trimmed. A signer that writes
    `…:05.500Z` signs other bytes than the verifier rebuilds (`…:05.5Z`): refused."""
    whole = moment.strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    return f"{whole}.{fraction}Z" if fraction else f"{whole}Z"


def test_timestamps_are_written_as_the_verifier_rebuilds_them() -> None:
    at = datetime(2026, 12, 6, 21, 17, 5, tzinfo=UTC)
    assert _rfc3339_as_signed(at) == "2026-12-06T21:17:05Z"
    assert _rfc3339_as_signed(at.replace(microsecond=500_000)) == "2026-12-06T21:17:05.5Z"
    assert _rfc3339_as_signed(at.replace(microsecond=750_000)) == "2026-12-06T21:17:05.75Z"
    assert _rfc3339_as_signed(at.replace(microsecond=123_456)) == "2026-12-06T21:17:05.123456Z"


def _request_envelope(child_id: str, delegation_id: str, child_input: Any) -> dict[str, Any]:
    # Milliseconds, as a publisher's clock often gives them; one in ten ends in a zero,
    # which the rule trims (the cause of this test's earlier one-in-ten refusal).
    now = datetime.now(UTC)
    sent_at = _rfc3339_as_signed(now.replace(microsecond=now.microsecond // 1000 * 1000))
    return {
        "aip_version": "1.0",
        "message_type": "aip.agent.v1.delegation_request",
        "message_id": "msg_" + secrets.token_hex(16),
        "sent_at": sent_at,
        "to": {"id": DELEGATE, "kind": "agent"},
        "body": {
            "delegation_request": {
                "delegation_id": delegation_id,
                "parent_action_id": "act_" + secrets.token_hex(16),
                "child_action": {
                    "id": child_id,
                    "capability_id": CHILD_CAPABILITY,
                    "input": child_input,
                    "mode": "async",
                    "idempotency_key": "idem-" + secrets.token_hex(6),
                    "timeout_ms": 60000,
                    "identity": {"service_account": {"id": DELEGATE, "kind": "agent"}},
                    "delegation_chain": [
                        {
                            "from": {"id": DELEGATOR, "kind": "human"},
                            "to": {"id": DELEGATE, "kind": "agent"},
                            "scope": "support.read",
                            "delegated_at": sent_at,
                        }
                    ],
                },
                "requested_by": {
                    "id": DELEGATOR,
                    "kind": "human",
                    "auth_context": {
                        "principal_kind": "user",
                        "issuer": ISSUER,
                        "credential_revision": 3,
                    },
                },
                "delegate": {"id": DELEGATE, "kind": "agent"},
                "scope": "support.read",
            }
        },
    }


async def test_a_delegation_request_built_from_the_rules_runs_and_every_answer_is_signed(
    dstack: DelegationStack,
) -> None:
    stack = dstack.stack
    await stack.spawn("w1")
    # The approval record of the exact child (the router requires one).
    like = dstack.request(child_input={"case_id": "case-7", "note": "Grüße", "weight": 1.5})
    await dstack.approve_child(like)
    child = like.action
    envelope = _request_envelope(child.id, like.delegation_id, child.input)
    gateway = key_of_nkey_seed(stack.trust.seed)
    signed = sign(envelope, gateway, {"id": "service:test-gateway", "kind": "service"})
    payload = canonical(signed)
    assert not list(_validator("aip.agent.v1.delegation_request").iter_errors(signed))

    seen: asyncio.Queue[bytes] = asyncio.Queue()

    async def keep(msg: Any) -> None:
        await seen.put(msg.data)

    sandbox = await stack.nc.subscribe(f"{SANDBOX_SUBJECT_PREFIX}.actions", cb=keep)
    action_id = "act_" + hashlib.sha256(DOMAIN + like.delegation_id.encode()).hexdigest()[:32]
    msg_id = f"{action_id}:{hashlib.sha256(payload).hexdigest()[:32]}"
    try:
        await stack.nc.jetstream().publish(
            stack.subjects.delegations("h1"), payload, headers={"Nats-Msg-Id": msg_id}
        )
        # The delegation's own answer: one signed action_result on its Action id.
        for _ in range(300):
            stored = await stack.stream_messages("results", stack.subjects.results("h1", action_id))
            if stored:
                break
            await asyncio.sleep(0.1)
        (data,) = stored
        dispatched = await asyncio.wait_for(seen.get(), 5)
    finally:
        await sandbox.unsubscribe()

    result = _verified(data, "aip.core.v1.action_result")
    assert result["from"]["id"] == DELEGATE
    body = result["body"]["action_result"]
    assert (body["action_id"], body["status"]) == (action_id, "completed"), body.get("error")
    delegation = body["output"]["delegation_result"]
    assert delegation["delegation_id"] == like.delegation_id
    assert (
        delegation["parent_action_id"] == envelope["body"]["delegation_request"]["parent_action_id"]
    )
    assert (delegation["child_action_id"], delegation["status"]) == (child.id, "completed")
    assert delegation["result"] == {
        "action_id": child.id,
        "status": "completed",
        "output": {"echo": child.input, "capability": CHILD_CAPABILITY},
    }

    # What the gateway sent the non-Hermes executor: the signed AIP Action of the child,
    # by the gateway key, with no header signature.
    sent = _verified(dispatched, "aip.core.v1.action", any_capability=True)
    assert sent["body"]["action"]["capability_id"] == CHILD_CAPABILITY
    assert sent["security"]["did"] == did_of(gateway)
    assert sent["body"]["action"]["id"] == child.id
    assert sent["body"]["action"]["input"] == child.input
    # The executor's answer: a signed action_result answering that very Envelope.
    echo_results = f"{SANDBOX_SUBJECT_PREFIX}.results.{child.id}"
    (echoed,) = await stack.stream_messages("results", echo_results)
    answer = _verified(echoed, "aip.core.v1.action_result")
    assert answer["in_response_to"] == sent["message_id"]
    assert answer["body"]["action_result"]["output"] == delegation["result"]["output"]
    assert answer["extensions"]["org.aip-hermes-worker"]["action_sha256"] == (
        hashlib.sha256(dispatched).hexdigest()
    )
