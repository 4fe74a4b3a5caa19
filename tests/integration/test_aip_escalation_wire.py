"""A live worker's escalation, read the way a consumer in another language reads it, and a
resolution written the way one would write it (plain `json`, PyNaCl, the did:key rules and
the mapping of shared/reference/aip-1.0-wire.md §1.10, §7.7 and docs/publishing.md
"Escalations on the wire"): nothing from the project's codec decides what is right.

- the escalation a paused operator run raises is one `aip.core.v1.escalation` Envelope,
  canonical JSON, signed by the worker's key (verified here with PyNaCl against the did:key
  derived by hand from its nkey seed), valid against the exported Envelope schema, its
  body mapped as documented;
- a resolution built by hand from the rules and signed with PyNaCl is taken by the reader
  (`read_escalations`, what `escalations list`, the console and the demo read); an unsigned
  one, one altered after signing and bytes that are no Envelope are refused, counted, and
  change nothing: the reader keeps the valid copy, Redis (the write-once authority) holds
  no resolution, the escalation is still open for `escalations list`.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
from pathlib import Path
from typing import Any

import jsonschema
import nacl.signing
from redis.asyncio import Redis

from tests.aip_actions import canonical, did_of
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_aip_results_wire import _worker_did
from tests.integration.test_escalations import cli
from tests.integration.test_signed_escalations_and_receipts import paused_run
from worker.escalation.ledger import Unreadable, read_escalations, read_resolution
from worker.trust.signing import TrustedGatewayKeys

OURS = "org.aip-hermes-worker"
SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"


def _validator(message_type: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{message_type}.json").read_text("utf-8"))
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def _signed(envelope: dict[str, Any], key: nacl.signing.SigningKey) -> dict[str, Any]:
    """§2.2 by hand: `from.did` and `security.did` name the key, the signature (standard
    base64, padded) is over the canonical Envelope without `security.signature`."""
    signed = copy.deepcopy(envelope)
    did = did_of(key)
    signed["from"] = {**signed["from"], "did": did}
    signed["security"] = {"did": did}
    signature = key.sign(canonical(signed)).signature
    signed["security"]["signature"] = base64.b64encode(signature).decode()
    return signed


async def test_a_live_escalation_is_a_signed_envelope_and_a_rule_built_resolution_is_read(
    stack: Stack,
) -> None:
    real = await paused_run(stack)
    [data] = await stack.stream_messages("escalations", stack.subjects.escalations(ENDPOINT))
    envelope = json.loads(data)
    assert data == canonical(envelope)
    _validator("aip.core.v1.escalation").validate(envelope)
    assert envelope["aip_version"] == "1.0"
    assert envelope["message_type"] == "aip.core.v1.escalation"
    did, verify_key = _worker_did(stack)
    assert envelope["from"] == {
        "id": f"agent:hermes_operator:{ENDPOINT}",
        "kind": "agent",
        "did": did,
    }
    unsigned = copy.deepcopy(envelope)
    security = unsigned.pop("security")
    assert security["did"] == did
    signature = base64.b64decode(security.pop("signature"), validate=True)
    unsigned["security"] = security
    verify_key.verify(canonical(unsigned), signature)  # raises unless the worker signed it

    # The escalation id is the message id's 32 hex digits; the rest is as documented.
    assert envelope["message_id"] == "msg_" + real.escalation_id.removeprefix("esc_")
    body = envelope["body"]["escalation"]
    assert body["kind"] == "approval"
    assert body["requested_by"] == {"id": "w1", "kind": "service"}
    assert body["risk"] == "high"  # the operator capability's
    choices = body["form"]["approval"]["choices"]
    assert "deny" in choices
    mapped = ["reject" if choice == "deny" else "approve" for choice in choices]
    assert body["allowed_decisions"] == list(dict.fromkeys(mapped))  # §7.7, in order
    assert body["timeout_ms"] == 900_000  # the operator timeout: the paused run's slot
    form = body["form"]
    assert form["status"] == "requires_human"
    assert form["approval"]["choices"] == [c.value for c in real.approval.choices]  # type: ignore[union-attr]
    assert form["approval"]["approval_generation"] == 1
    assert form["approval"]["prompt"]["event"] == "approval.request"
    assert form["principal"]["principal_id"] == real.principal_id
    assert body["reason"] == form["decision"]  # no diagnostic: the runbook decision
    ours = envelope["extensions"][OURS]
    assert ours["action_id"] == real.action_id
    assert (ours["endpoint_id"], ours["fence"]) == (ENDPOINT, real.fence)
    assert ours["capability"] == f"cap:hermes_agent:{ENDPOINT}:operator"

    # A resolution copy written by hand from the rules, signed by a person's key.
    person = nacl.signing.SigningKey.generate()
    resolution: dict[str, Any] = {
        "aip_version": "1.0",
        "message_type": "aip.core.v1.escalation_resolution",
        "message_id": "msg_" + secrets.token_hex(16),
        "sent_at": "2026-01-02T03:04:05.678Z",
        "in_response_to": envelope["message_id"],
        "from": {"id": "ops:erin", "kind": "human"},
        "body": {
            "escalation_resolution": {
                "status": "approved",
                "resolved_by": {"id": "ops:erin", "kind": "human"},
                "resolved_at": "2026-01-02T03:04:05.678Z",
                "result": {"reason": "the valid copy", "choice": "once"},
            }
        },
        "extensions": {
            OURS: {
                "action_id": real.action_id,
                "endpoint_id": ENDPOINT,
                "resolved_at_unix_ms": 1_767_323_045_678,
            }
        },
    }
    valid = _signed(resolution, person)
    _validator("aip.core.v1.escalation_resolution").validate(valid)
    altered = copy.deepcopy(valid)
    altered["body"]["escalation_resolution"]["result"]["reason"] = "altered after signing"
    bare = copy.deepcopy(resolution)
    bare["body"]["escalation_resolution"]["result"]["reason"] = "unsigned"
    js = stack.nc.jetstream()
    subject = stack.subjects.escalation_resolutions(ENDPOINT)
    for index, document in enumerate((altered, bare, valid)):
        await js.publish(subject, canonical(document), headers={"Nats-Msg-Id": f"copy-{index}"})

    # Bytes that are no Envelope at all, on both subjects: counted, never a crash.
    await js.publish(subject, b"\xff not json", headers={"Nats-Msg-Id": "garbage-r"})
    await js.publish(
        stack.subjects.escalations(ENDPOINT), b"[]", headers={"Nats-Msg-Id": "garbage-e"}
    )

    unreadable = Unreadable()
    trusted = TrustedGatewayKeys.load(stack.trust.worker_keys_file)
    [view] = await read_escalations(js, stack.subjects, ENDPOINT, unreadable, trusted=trusted)
    assert view.escalation == real
    assert unreadable.count == 4  # the altered and unsigned copies, the two garbage messages
    assert unreadable.unverified == {}
    assert view.resolution is not None
    assert view.resolution.reason == "the valid copy"
    assert view.resolution.kind.value == "answered"
    assert view.resolution.choice is not None
    assert view.resolution.choice.value == "once"
    assert view.resolution.resolved_by == "ops:erin"
    assert view.resolution.resolved_at_unix_ms == 1_767_323_045_678

    # None of the copies is the authority: nothing was recorded, it is still open.
    redis = Redis.from_url(stack.redis_url)
    try:
        assert await read_resolution(redis, real.escalation_id) is None
    finally:
        await redis.aclose()
    code, out, err = await cli(stack, "escalations", "list", "--endpoint", ENDPOINT)
    assert code == 0, err
    assert real.escalation_id in out
    assert " open " in out, out
