"""A live worker's manifest answer, asked and read the way a peer in another language would
(plain `json`, PyNaCl, the did:key rules: shared/reference/aip-1.0-wire.md §1.1, §1.14, §2,
docs/publishing.md "Discovery"): the request is a hand-written `manifest_request` Envelope
signed with PyNaCl (tests/aip_actions.py), the answer's signature is checked against the did:key
of the worker's nkey seed derived here by hand. Nothing from the project's codec decides what
is right.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
from datetime import UTC, datetime
from typing import Any

import nacl.signing

from tests.aip_actions import canonical, did_of, sign
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_aip_results_wire import _worker_did

CALLER = nacl.signing.SigningKey(bytes(range(100, 132)))


def _request(body: dict[str, Any]) -> dict[str, Any]:
    envelope = {
        "aip_version": "1.0",
        "message_type": "aip.discovery.v1.manifest_request",
        "message_id": "msg_" + secrets.token_hex(16),
        "sent_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "correlation_id": "corr-live-manifest",
        "body": {"manifest_request": body},
    }
    return sign(envelope, CALLER, {"id": "service:peer", "kind": "service"})


async def _ask(stack: Stack, envelope: dict[str, Any] | bytes) -> dict[str, Any]:
    data = envelope if isinstance(envelope, bytes) else canonical(envelope)
    reply = await stack.nc.request(stack.subjects.manifest(ENDPOINT), data, timeout=5)
    answer: dict[str, Any] = json.loads(reply.data)
    did, key = _worker_did(stack)
    unsigned = copy.deepcopy(answer)
    signature = base64.b64decode(unsigned["security"].pop("signature"))
    assert unsigned["security"]["did"] == did
    key.verify(canonical(unsigned), signature)
    return answer


async def test_a_live_worker_answers_a_hand_built_request_with_its_signed_manifest(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    request = _request({"filter": {"capability_ids": [f"cap:hermes_agent:{ENDPOINT}:chat"]}})
    answer = await _ask(stack, request)
    assert answer["message_type"] == "aip.discovery.v1.manifest_response"
    assert answer["in_response_to"] == request["message_id"]
    assert answer["to"] == {"id": "service:peer", "kind": "service", "did": did_of(CALLER)}
    assert answer["correlation_id"] == "corr-live-manifest"
    manifest = answer["body"]["manifest"]
    assert [c["id"] for c in manifest["capabilities"]] == [f"cap:hermes_agent:{ENDPOINT}:chat"]
    assert manifest["compatibility"]["native_nats"]["subject"] == f"aip.hermes.{ENDPOINT}.actions"

    everything = await _ask(stack, _request({}))
    names = sorted(c["name"] for c in everything["body"]["manifest"]["capabilities"])
    assert len(names) == 35
    assert {"chat", "chat_stream", "responses", "responses_stream", "operator"} <= set(names)
    assert {"sessions_list", "session_patch", "jobs_list"} <= set(names)


async def test_a_request_that_is_not_an_envelope_gets_a_signed_error(stack: Stack) -> None:
    await stack.spawn("w1")
    for bad in (b"", b"{}"):
        answer = await _ask(stack, bad)
        assert answer["message_type"] == "aip.core.v1.error"
        assert answer["body"]["error"]["error"]["code"]
    forged = _request({})
    forged["correlation_id"] = "changed after signing"
    answer = await _ask(stack, forged)
    assert answer["message_type"] == "aip.core.v1.error"
    assert answer["body"]["error"]["error"]["code"] == "connector_host.authentication"
