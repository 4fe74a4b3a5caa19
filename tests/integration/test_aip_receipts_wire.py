"""A live worker's audit receipts, read the way a consumer in another language reads them
(plain `json`, `hashlib`, PyNaCl, the did:key rules; docs/publishing.md "Audit receipts",
shared/reference/aip-1.0-wire.md §1.15, §2.7): nothing from the project's codec decides
what is right.

Every message on the Action's audit subject is one `aip.audit.v1.receipt_chain` Envelope,
canonical JSON, valid against the exported schema, holding one AIP Receipt whose `hash` is
the sha256 of its canonical JSON without `hash` (recomputed here) and whose `root_hash` is
the sha256 of that hash; receipts link by `previous_hash`, every segment ends in an
Envelope the worker's key signed (PyNaCl over the canonical bytes rebuilt by hand, against
the did:key derived from its nkey seed), and every receipt links forward to a signed one.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path

import jsonschema
import pytest

from tests.aip_wire import aip_receipt
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_aip_results_wire import _canonical, _worker_did

SCHEMA = (
    Path(__file__).resolve().parents[2] / "schemas" / "json" / "aip.audit.v1.receipt_chain.json"
)


@pytest.mark.aip_family("audit_redaction", assertions=["receipts_emitted"])
async def test_a_live_actions_receipts_are_hash_chained_aip_receipts_signed_per_segment(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    action = stack.action("models")
    await (await stack.publish(action)).result(timeout_s=30)
    await stack.settled_and_acked()
    messages = await stack.stream_messages("audit", stack.subjects.audit(ENDPOINT, action.id))
    assert len(messages) >= 3
    validator = jsonschema.Draft202012Validator(
        json.loads(SCHEMA.read_text("utf-8")), format_checker=jsonschema.FormatChecker()
    )
    did, verify_key = _worker_did(stack)
    receipts, signed_hashes = [], set()
    for data in messages:
        envelope = json.loads(data)
        assert data == _canonical(envelope)
        assert [e.message for e in validator.iter_errors(envelope)] == []
        chain = envelope["body"]["receipt_chain"]
        (receipt,) = chain["receipts"]
        assert chain["chain_id"] == action.id
        without = {k: v for k, v in receipt.items() if k != "hash"}
        assert receipt["hash"] == hashlib.sha256(_canonical(without)).hexdigest()
        assert chain["root_hash"] == hashlib.sha256(receipt["hash"].encode()).hexdigest()
        fields = {**receipt["data"], "prev_sha256": receipt.get("previous_hash")}
        assert aip_receipt(fields) == receipt  # id, type, actor, time follow from the data
        assert envelope["message_id"] == "msg_" + receipt["id"].removeprefix("rcpt_")
        if "security" in envelope:
            assert envelope["security"]["did"] == envelope["from"]["did"] == did
            unsigned = copy.deepcopy(envelope)
            signature = base64.b64decode(unsigned["security"].pop("signature"), validate=True)
            verify_key.verify(_canonical(unsigned), signature)
            signed_hashes.add(receipt["hash"])
        receipts.append(receipt)
    assert signed_hashes
    types = {r["data"]["event"]: r["receipt_type"] for r in receipts}
    assert types["received"] == "request_received"
    assert types["settled"] == "result_returned"
    by_hash = {r["hash"]: r for r in receipts}
    vouched = set()
    for start in signed_hashes:  # walk each signed receipt's links back
        link: str | None = start
        while link is not None and link in by_hash:
            vouched.add(link)
            link = by_hash[link].get("previous_hash")
        assert link is None, "a segment links to a receipt that is not on the subject"
    assert vouched == set(by_hash), "a receipt no signed Envelope vouches for"
