"""A live worker's DLQ entries, read the way a consumer in another language reads them
(plain `json`, `base64`, `hashlib`, PyNaCl, the did:key rules; docs/publishing.md "The
dead-letter queue", shared/reference/aip-1.0-wire.md §1.7 and §7.13): nothing from the
project's codec decides what is right.

- a refused message becomes one `aip.lifecycle.v1.action_status` Envelope in state
  `dead_lettered`, canonical JSON, valid against the exported Envelope schema, signed by
  the worker's key (verified with PyNaCl over the canonical bytes rebuilt by hand, against
  the did:key derived from its nkey seed); its facts name the refused bytes' size and
  sha256 and keep the bytes themselves, which are exactly what was published;
- an envelope that was never authenticated is filed under the entry's own `dlq_` id, an
  authenticated Action's (a squatter of another Action's dedupe id) under its own id;
- `dlq show` of that entry shows the same facts and the envelope as published.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema

from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_aip_results_wire import _canonical, _worker_did
from tests.integration.test_dlq_commands import cli

OURS = "org.aip-hermes-worker"
SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"
STATUS = "aip.lifecycle.v1.action_status"


def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{STATUS}.json").read_text("utf-8"))
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def _checked(stack: Stack, data: bytes) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    """One DLQ message checked from the rules: its Envelope, its facts, the kept bytes."""
    envelope = json.loads(data)
    assert data == _canonical(envelope)
    errors = [e.message for e in _validator().iter_errors(envelope)]
    assert errors == []
    assert envelope["message_type"] == STATUS
    did, verify_key = _worker_did(stack)
    assert envelope["security"]["did"] == envelope["from"]["did"] == did
    assert envelope["from"]["id"] == f"agent:hermes_operator:{ENDPOINT}"
    unsigned = copy.deepcopy(envelope)
    signature = base64.b64decode(unsigned["security"].pop("signature"), validate=True)
    verify_key.verify(_canonical(unsigned), signature)  # raises if it does not verify
    status = envelope["body"]["action_status"]
    assert set(status) == {"action_id", "state", "updated_at"}
    assert status["state"] == "dead_lettered"
    facts = envelope["extensions"][OURS]["dead_letter"]
    assert envelope["message_id"] == "msg_" + facts["dlq_id"].removeprefix("dlq_")
    kept = base64.b64decode(facts["kept"], validate=True)
    return envelope, facts, kept


async def test_a_refused_message_is_a_signed_dead_lettered_action_status(stack: Stack) -> None:
    await stack.spawn("w1")
    junk = b'{"not": "an action", "note": "caf\xc3\xa9"}'
    await stack.publish_raw(junk)
    await stack.settled_and_acked()
    (data,) = await stack.stream_messages("dlq", stack.subjects.dlq(ENDPOINT))
    envelope, facts, kept = _checked(stack, data)
    assert kept == junk
    assert (facts["size"], facts["sha256"]) == (len(junk), hashlib.sha256(junk).hexdigest())
    assert (facts["code"], facts["category"]) == ("schema.envelope.invalid", "permanent")
    assert facts["subject"] == stack.subjects.actions(ENDPOINT)
    assert facts["stream_seq"] >= 1
    # Never authenticated: no Action id it merely claims is written as its state.
    assert envelope["body"]["action_status"]["action_id"] == facts["dlq_id"]

    code, out, err = await cli(stack, "dlq", "show", facts["dlq_id"], "--endpoint", ENDPOINT)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["envelope"] == json.loads(junk)
    assert (shown["size"], shown["kept"], shown["sha256"]) == (
        len(junk),
        len(junk),
        facts["sha256"],
    )
    assert shown["action_id"] is None


async def test_an_authenticated_actions_entry_is_filed_as_its_status(stack: Stack) -> None:
    await stack.spawn("w1")
    victim, squatter = stack.action("models"), stack.action("models")
    await stack.publish(squatter, msg_id=victim.id)  # signed and valid, wrong Nats-Msg-Id
    await stack.settled_and_acked()
    (data,) = await stack.stream_messages("dlq", stack.subjects.dlq(ENDPOINT))
    envelope, facts, kept = _checked(stack, data)
    assert envelope["body"]["action_status"]["action_id"] == squatter.id
    assert facts["code"] == "connector_host.replay"
    assert json.loads(kept)["body"]["action"]["id"] == squatter.id
