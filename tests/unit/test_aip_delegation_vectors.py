"""The delegation_request vectors (written by hand in tests/vectors/aip/make_vectors.py
from the AIP rules) against the delegations subject's wire (`worker.wire.delegations`):
each valid one decodes to the request its fields say, and sealing that request again
with the vector's key gives the vector's body, extension and frame, so the encoder writes
what the rules write; each invalid one is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schemas.errors import EnvelopeRejected
from schemas.lifecycle import QueueRecord
from worker.aip import AipSigner
from worker.wire.delegations import decode_delegation, encode_delegation
from worker.wire.runtime_records import (
    decode_lifecycle_record,
    decode_queue_record,
    encode_lifecycle_record,
    encode_queue_record,
)

ROOT = Path(__file__).parents[2]
CASES = json.loads(
    (ROOT / "tests" / "vectors" / "aip" / "message_envelopes.json").read_text("utf-8")
)["message_types"]["aip.agent.v1.delegation_request"]


def _bytes(envelope: dict[str, Any]) -> bytes:
    return json.dumps(envelope, ensure_ascii=False).encode()


@pytest.mark.parametrize("case", CASES["valid"], ids=lambda case: case["name"][:40])
def test_a_valid_delegation_decodes_and_reseals_to_the_same_bytes(case: dict[str, Any]) -> None:
    envelope = case["envelope"]
    request, opened = decode_delegation(_bytes(envelope))
    assert opened.verified is not None
    assert opened.verified.did == case["did"]
    body = envelope["body"]["delegation_request"]
    assert request.delegation_id == body["delegation_id"]
    assert request.delegate == body["delegate"]["id"]
    assert request.action.id == body["child_action"]["id"]
    assert request.chain == [hop["from"]["id"] for hop in body["child_action"]["delegation_chain"]]
    assert " ".join(request.scopes) == body["scope"]
    assert request.action.delegation is not None
    assert request.action.delegation.parent_action_id == body["parent_action_id"]
    if "extensions" not in envelope:
        return  # created at sent_at: re-sealed it would name its creation in the extension
    signer = AipSigner.from_seed(bytes([case["seed"]]) * 32)
    sender = {key: value for key, value in envelope["from"].items() if key != "did"}
    resealed = encode_delegation(
        request, signer=signer, sender=sender, message_id=envelope["message_id"]
    )
    again = json.loads(resealed)
    # What the rules wrote, field for field; `sent_at` is the request's creation when we
    # seal (the vector's frame time is its own), so the signature differs with it.
    for name in ("body", "extensions", "from", "to", "message_id", "message_type"):
        assert again[name] == envelope[name], name


@pytest.mark.parametrize("case", CASES["invalid"], ids=lambda case: case["name"][:40])
def test_an_invalid_delegation_is_refused(case: dict[str, Any]) -> None:
    with pytest.raises(EnvelopeRejected):
        decode_delegation(_bytes(case["envelope"]))


RECORDS = json.loads(
    (ROOT / "tests" / "vectors" / "aip" / "message_envelopes.json").read_text("utf-8")
)["message_types"]["aip.lifecycle.v1.action_status"]


def _decode_record(envelope: dict[str, Any]) -> Any:
    ours = envelope.get("extensions", {}).get("org.aip-hermes-worker", {})
    if ours.get("record") == "lifecycle":
        return decode_lifecycle_record(_bytes(envelope))
    return decode_queue_record(_bytes(envelope))


#: The runtime's records among the ActionStatus vectors (the others are DLQ entries).
RUNTIME_RECORDS = [
    case
    for case in RECORDS["valid"]
    if "record" in case["envelope"]["extensions"]["org.aip-hermes-worker"]
]


@pytest.mark.parametrize("case", RUNTIME_RECORDS, ids=lambda case: case["name"][:40])
def test_a_valid_runtime_record_decodes_and_reseals_to_the_same_body(
    case: dict[str, Any],
) -> None:
    envelope = case["envelope"]
    record, opened = _decode_record(envelope)
    assert opened.verified is not None
    assert opened.verified.did == case["did"]
    signer = AipSigner.from_seed(bytes([case["seed"]]) * 32)
    sender = {key: value for key, value in envelope["from"].items() if key != "did"}
    if isinstance(record, QueueRecord):
        assert record.action.id == envelope["body"]["action_status"]["action_id"]
        assert record.tenant_partition == "acme"
        resealed = encode_queue_record(record, signer=signer, sender=sender)
    else:
        assert record.result is not None
        assert record.result.error is not None
        assert record.result.error["code"] == "connector.hermes_agent.operator_policy"
        resealed = encode_lifecycle_record(record, signer=signer, sender=sender)
    again = json.loads(resealed)
    for name in ("body", "extensions", "from", "message_type", "sent_at"):
        assert again[name] == envelope[name], name


@pytest.mark.parametrize("case", RECORDS["invalid"], ids=lambda case: case["name"][:40])
def test_an_invalid_runtime_record_is_refused(case: dict[str, Any]) -> None:
    with pytest.raises(EnvelopeRejected):
        _decode_record(case["envelope"])
