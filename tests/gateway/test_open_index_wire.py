"""The gateway's open-children index (`aip.runtime.open.{shard}`) against the AIP rules.

Each shard message is an `aip.lifecycle.v1.action_list` Envelope signed by the gateway key
(worker/wire/open_index.py). Checked here the way an AIP reader in another language checks
it: the exported JSON Schema with `jsonschema`, the signature with PyNaCl over canonical
JSON rebuilt by hand (`tests.aip_actions`), and a shard built by hand from the same rules
is read by the gateway's sweep; one signed by another key, or in the old JSON-map form, is
not believed.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import nacl.signing
import nats
import pytest
from nats.js import JetStreamContext

from subjects.grammar import Subjects
from subjects.provision import provision
from tests.aip_actions import canonical, did_of, key_of_nkey_seed, sign
from worker.gateway.open_children import OpenChildren, shard_of
from worker.testing.identities import write_trust_files
from worker.testing.services import ServiceHandle
from worker.trust.signing import read_seed_file

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"
SCHEMA = json.loads((SCHEMAS / "aip.lifecycle.v1.action_list.json").read_text("utf-8"))
#: The gateway's Principal on what it signs (`worker.wire.actions.GATEWAY_SENDER`).
GATEWAY = {"id": "service:aip-gateway", "kind": "service"}


@pytest.fixture
async def index(
    tmp_path: Path, nats_server: ServiceHandle
) -> AsyncIterator[tuple[OpenChildren, JetStreamContext, Subjects, bytes]]:
    subjects = Subjects("oi" + secrets.token_hex(3))
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await provision(js, subjects, ["h1"], runtime_stores=True)
    seed = read_seed_file(write_trust_files(tmp_path).seed_file)
    try:
        yield OpenChildren(js, subjects, seed), js, subjects, seed
    finally:
        await nc.close()


def _child(digit: str = "a") -> str:
    return f"act_{digit}{secrets.token_hex(15)}{secrets.token_hex(1)[:1]}"


async def _shard(js: JetStreamContext, subjects: Subjects, shard: str) -> dict[str, Any]:
    msg = await js.get_last_msg(subjects.runtime_stream_name("open"), subjects.runtime_open(shard))
    envelope: dict[str, Any] = json.loads(msg.data or b"")
    return envelope


def _unsigned_copy(envelope: dict[str, Any]) -> dict[str, Any]:
    unsigned = copy.deepcopy(envelope)
    del unsigned["security"]["signature"]
    return unsigned


async def test_an_open_shard_is_a_schema_valid_action_list_signed_by_the_gateway_key(
    index: tuple[OpenChildren, JetStreamContext, Subjects, bytes],
) -> None:
    children, js, subjects, seed = index
    first, second = _child("b"), _child("b")
    await children.add(first)
    await children.add(second)
    envelope = await _shard(js, subjects, "b")
    jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(
        envelope
    )
    assert envelope["message_type"] == "aip.lifecycle.v1.action_list"
    listed = envelope["body"]["action_list"]
    assert listed["total_size"] == 2
    assert [a["action_id"] for a in listed["actions"]] == sorted([first, second])
    assert {a["state"] for a in listed["actions"]} == {"accepted"}
    assert all(a["updated_at"].endswith("Z") for a in listed["actions"])
    key = key_of_nkey_seed(seed)
    assert envelope["security"]["did"] == envelope["from"]["did"] == did_of(key)
    signature = base64.b64decode(envelope["security"]["signature"], validate=True)
    key.verify_key.verify(canonical(_unsigned_copy(envelope)), signature)
    # Removed once settled: the shard lists what stays open.
    await children.remove(first)
    listed = (await _shard(js, subjects, "b"))["body"]["action_list"]
    assert [a["action_id"] for a in listed["actions"]] == [second]
    assert listed["total_size"] == 1


async def test_a_hand_built_shard_is_read_and_an_untrusted_or_old_one_is_not(
    index: tuple[OpenChildren, JetStreamContext, Subjects, bytes],
) -> None:
    children, js, subjects, seed = index
    child = _child("c")
    assert shard_of(child) == "c"

    def shard(key: nacl.signing.SigningKey) -> bytes:
        envelope = {
            "aip_version": "1.0",
            "message_type": "aip.lifecycle.v1.action_list",
            "message_id": "msg_" + secrets.token_hex(16),
            "sent_at": "2026-12-02T10:00:01Z",
            "body": {
                "action_list": {
                    "actions": [
                        {
                            "action_id": child,
                            "state": "accepted",
                            "updated_at": "2026-12-02T10:00:00.250Z",
                        }
                    ],
                    "total_size": 1,
                }
            },
        }
        return canonical(sign(envelope, key, GATEWAY))

    subject = subjects.runtime_open("c")
    await js.publish(subject, shard(key_of_nkey_seed(seed)))
    assert await children.snapshot() == {child: 1796205600250}
    # Signed by a key that is not a gateway's: never believed.
    await js.publish(subject, shard(nacl.signing.SigningKey.generate()))
    assert await children.snapshot() == {}
    # The shard's old form, a bare JSON map, is not an Envelope: not believed either.
    await js.publish(subject, json.dumps({child: 1796205600250}).encode())
    assert await children.snapshot() == {}
