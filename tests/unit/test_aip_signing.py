"""AIP 1.0 Envelope signatures (worker/aip/signing.py): what is signed, how it verifies,
and the typed failure of every check (reference §2.2-2.6)."""

from __future__ import annotations

import base64
import copy
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.aip import (
    AipSigner,
    AipWireError,
    BadSignature,
    InvalidDidKey,
    MalformedEnvelope,
    MalformedJson,
    MalformedSignature,
    MissingSignature,
    NotCanonicalizable,
    SignerMismatch,
    UnportableNumber,
    encode_envelope,
    format_timestamp,
    loads,
    sign_envelope,
    signing_bytes,
    verify_envelope,
)
from worker.aip.canonical import canonical_bytes
from worker.aip.envelope import rfc3339_canonical

SIGNER = AipSigner.from_seed(bytes([11]) * 32)
OTHER = AipSigner.from_seed(bytes([12]) * 32)
GATEWAY = {"id": "service:getaip:gateway", "kind": "service"}


def action_envelope(input_value: Any = None) -> dict[str, Any]:
    return {
        "aip_version": "1.0",
        "message_type": "aip.core.v1.action",
        "message_id": "msg_0193a1b2c3d47e8f9a0b1c2d3e4f5a6b",
        "sent_at": "2026-12-01T23:00:00Z",
        "correlation_id": "corr_0193a1b2c3d47e8f9a0b1c2d3e4f5a6c",
        "security": {"trust_domain": "example.com"},
        "body": {
            "action": {
                "id": "act_0193a1b2c3d47e8f9a0b1c2d3e4f5a6e",
                "capability_id": "cap:test:signature",
                "input": {"signature": "business-value"} if input_value is None else input_value,
            }
        },
    }


def signed_wire(input_value: Any = None) -> bytes:
    return encode_envelope(sign_envelope(action_envelope(input_value), SIGNER, GATEWAY))


def test_signing_names_the_key_twice_and_covers_security() -> None:
    signed = sign_envelope(action_envelope(), SIGNER, GATEWAY)
    assert signed["from"] == {**GATEWAY, "did": SIGNER.did}
    assert signed["security"]["did"] == SIGNER.did
    assert signed["security"]["trust_domain"] == "example.com"  # kept, and signed
    signature = base64.b64decode(signed["security"]["signature"], validate=True)
    assert len(signature) == 64
    assert signed["security"]["signature"].endswith("==")
    unsigned = {**signed, "security": {"did": SIGNER.did, "trust_domain": "example.com"}}
    # What is signed: the Envelope with only security.signature removed, canonicalised.
    assert signing_bytes(signed) == canonical_bytes(unsigned)
    SIGNER.public_key.verify_key.verify(canonical_bytes(unsigned), signature)
    verified = verify_envelope(encode_envelope(signed))
    assert verified.did == SIGNER.did
    assert verified.envelope == signed


def test_a_business_field_named_signature_is_covered() -> None:
    # aip-crypto `envelope_signature_covers_application_signature_fields` (seed [11; 32]).
    signed = sign_envelope(action_envelope(), SIGNER, GATEWAY)
    signed["body"]["action"]["input"]["signature"] = "tampered"
    with pytest.raises(BadSignature):
        verify_envelope(encode_envelope(signed))


def test_resigning_replaces_the_old_signature_and_did() -> None:
    first = sign_envelope(action_envelope(), OTHER, GATEWAY)
    second = sign_envelope({k: v for k, v in first.items() if k != "from"}, SIGNER, GATEWAY)
    assert second["security"]["did"] == SIGNER.did
    assert verify_envelope(encode_envelope(second)).did == SIGNER.did


def test_non_canonical_encodings_of_a_signed_envelope_still_verify() -> None:
    signed = sign_envelope(action_envelope({"price": 100.0, "note": "café"}), SIGNER, GATEWAY)
    pretty = json.dumps(signed, indent=3, ensure_ascii=True)  # \u00e9, spaces, newlines
    pretty = pretty.replace("100.0", "1.000E2").replace(
        '"2026-12-01T23:00:00Z"', '"2026-12-01T23:00:00.000+00:00"'
    )
    reordered = json.loads(pretty, object_pairs_hook=lambda pairs: dict(reversed(pairs)))
    for variant in (pretty.encode(), json.dumps(reordered).encode()):
        assert verify_envelope(variant).did == SIGNER.did
    # Explicit nulls for absent optionals read as absent, as upstream's types read them.
    with_nulls = {**signed, "session_id": None, "trace": None}
    assert verify_envelope(json.dumps(with_nulls).encode()).did == SIGNER.did


def test_the_expected_signer_can_be_pinned_by_did_or_nkey() -> None:
    wire = signed_wire()
    assert verify_envelope(wire, expected=SIGNER.did).did == SIGNER.did
    assert verify_envelope(wire, expected=SIGNER.public_key.nkey).did == SIGNER.did
    with pytest.raises(SignerMismatch):
        verify_envelope(wire, expected=OTHER.public_key)


def _mutated(change: Any) -> bytes:
    envelope = loads(signed_wire())
    change(envelope)
    return json.dumps(envelope).encode()


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda e: e.pop("security"), MissingSignature),
        (lambda e: e["security"].pop("signature"), MissingSignature),
        (lambda e: (e["security"].pop("did"), e["from"].pop("did")), MissingSignature),
        (
            lambda e: e["security"].update(signature=e["security"]["signature"][:-2]),
            MalformedSignature,
        ),
        (
            lambda e: e["security"].update(
                signature=e["security"]["signature"].replace("+", "-").replace("/", "_")
                if "+" in e["security"]["signature"] or "/" in e["security"]["signature"]
                else "-" + e["security"]["signature"][1:]
            ),
            MalformedSignature,
        ),
        (lambda e: e["security"].update(signature="A" * 85 + "B=="), MalformedSignature),
        (lambda e: e["security"].update(signature=12), MalformedSignature),
        (lambda e: e["security"].update(did="did:key:zNotBase58!"), InvalidDidKey),
        (lambda e: e["security"].update(did=7), InvalidDidKey),
        (lambda e: e["from"].update(did=OTHER.did), SignerMismatch),
        (
            lambda e: (e["security"].update(did=OTHER.did), e["from"].update(did=OTHER.did)),
            BadSignature,
        ),
        (
            lambda e: e["security"].update(signature=base64.b64encode(bytes(64)).decode()),
            BadSignature,
        ),
        (lambda e: e["security"].update(trust_domain="evil.example"), BadSignature),
        (lambda e: e.update(sent_at="2026-12-01T23:00:01Z"), BadSignature),
        (lambda e: e["from"].update(kind="human"), BadSignature),
        (lambda e: e.update(aip_version="1.1"), MalformedEnvelope),
        (lambda e: e.update(message_type="aip.core.v1.ack"), MalformedEnvelope),
        (lambda e: e.update(surprise=1), MalformedEnvelope),
        (lambda e: e["body"].update(ack={}), MalformedEnvelope),
        (lambda e: e["body"].update(action=["not", "an", "object"]), MalformedEnvelope),
        (lambda e: e.update(sent_at="yesterday"), MalformedEnvelope),
        (lambda e: e.update(idempotency_key=""), MalformedEnvelope),
        (lambda e: e.update(security="signed"), MissingSignature),
    ],
)
def test_each_failed_check_has_its_typed_error(change: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        verify_envelope(_mutated(change))
    assert isinstance(caught.value, AipWireError)
    assert not caught.value.retryable
    assert not caught.value.uncertain_outcome


def test_a_repeated_key_on_the_wire_is_refused_not_last_wins() -> None:
    wire = signed_wire().decode()
    doubled = wire.replace('"aip_version":"1.0"', '"aip_version":"1.0","aip_version":"1.0"')
    with pytest.raises(MalformedJson):
        verify_envelope(doubled.encode())


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda e: e.update(session_id=None), MalformedEnvelope),  # omit, never null
        (lambda e: e.update(sent_at="2026-12-01T23:00:00+00:00"), MalformedEnvelope),
        (lambda e: e.update(sent_at="2026-12-01T23:00:00.500Z"), MalformedEnvelope),
        (lambda e: e.update(sent_at="2026-12-02T01:00:00+02:00"), MalformedEnvelope),
        (lambda e: e.update(security=[]), MalformedEnvelope),
        (lambda e: e["body"]["action"].update(input={"x": math.nan}), NotCanonicalizable),
        (lambda e: e["body"]["action"].update(input={1: "int key"}), NotCanonicalizable),
    ],
)
def test_signing_refuses_what_a_verifier_would_read_otherwise(
    change: Any, error: type[Exception]
) -> None:
    envelope = action_envelope()
    change(envelope)
    with pytest.raises(error):
        sign_envelope(envelope, SIGNER, GATEWAY)


def test_signing_refuses_a_principal_claiming_another_did() -> None:
    with pytest.raises(SignerMismatch):
        sign_envelope(action_envelope(), SIGNER, {**GATEWAY, "did": OTHER.did})


def test_portable_numbers_can_be_required() -> None:
    envelope = action_envelope({"n": 2**70})
    assert verify_envelope(encode_envelope(sign_envelope(envelope, SIGNER, GATEWAY)))
    with pytest.raises(UnportableNumber):
        sign_envelope(envelope, SIGNER, GATEWAY, require_portable_numbers=True)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("2026-12-01T23:00:00Z", "2026-12-01T23:00:00Z"),
        ("2026-12-01T23:00:00+00:00", "2026-12-01T23:00:00Z"),
        ("2026-12-01T23:00:00-00:00", "2026-12-01T23:00:00Z"),
        ("2026-12-01T23:00:05.500Z", "2026-12-01T23:00:05.5Z"),
        ("2026-12-01T23:00:05.000Z", "2026-12-01T23:00:05Z"),
        ("2026-12-01T23:00:05.123456789Z", "2026-12-01T23:00:05.123456789Z"),
        ("2026-12-01T23:00:00+02:00", "2026-12-01T23:00:00+02:00"),  # the offset stays
    ],
)
def test_timestamps_re_render_as_the_time_crate_writes_them(text: str, canonical: str) -> None:
    assert rfc3339_canonical(text) == canonical


@pytest.mark.parametrize(
    "text",
    [
        "2026-02-30T00:00:00Z",
        "2026-12-01 23:00:00Z",
        "2026-12-01T23:00:00",
        "2026-12-01T24:00:00Z",
        "2026-12-01T23:00:60Z",
        "2026-12-01t23:00:00z",
        "2026-12-01T23:00:00+24:00",
        "\uff12026-12-01T23:00:00Z",
        "2026-12-01T23:00:05.1234567891Z",  # beyond nanoseconds
    ],
)
def test_malformed_timestamps_are_refused(text: str) -> None:
    with pytest.raises(MalformedEnvelope):
        rfc3339_canonical(text)


def test_format_timestamp_writes_utc_z() -> None:
    from datetime import datetime, timedelta, timezone

    moment = datetime(2026, 12, 2, 1, 0, 5, 500000, tzinfo=timezone(timedelta(hours=2)))
    assert format_timestamp(moment) == "2026-12-01T23:00:05.5Z"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=16,
)


@settings(max_examples=150)
@given(json_values)
def test_verify_of_sign_holds_for_any_json_input(value: Any) -> None:
    wire = signed_wire({"value": value})
    assert verify_envelope(wire).did == SIGNER.did


@settings(max_examples=300)
@given(st.data())
def test_any_byte_change_fails_or_changes_nothing_signed(data: st.DataObject) -> None:
    value = data.draw(json_values)
    wire = bytearray(signed_wire({"value": value, "note": "é/ünïcode"}))
    original = loads(bytes(wire))
    index = data.draw(st.integers(min_value=0, max_value=len(wire) - 1))
    replacement = data.draw(
        st.integers(min_value=0, max_value=255).filter(lambda b: b != wire[index])
    )
    wire[index] = replacement
    try:
        verified = verify_envelope(bytes(wire))
    except AipWireError:
        return
    # Only a change of spelling survives (e.g. `e+21` -> `E+21`): the content is the same.
    assert verified.envelope == original
    assert canonical_bytes(verified.envelope) == canonical_bytes(original)


@settings(max_examples=100)
@given(st.text(min_size=1), st.text(min_size=1))
def test_changing_a_business_signature_value_breaks_the_signature(
    original: str, replacement: str
) -> None:
    # aip-crypto/tests/signature_properties.rs (seed [17; 32]).
    if original == replacement:
        return
    signer = AipSigner.from_seed(bytes([17]) * 32)
    envelope = action_envelope({"document": {"signature": original}})
    signed = sign_envelope(envelope, signer, GATEWAY)
    assert verify_envelope(encode_envelope(signed)).did == signer.did
    tampered = copy.deepcopy(signed)
    tampered["body"]["action"]["input"]["document"]["signature"] = replacement
    with pytest.raises(BadSignature):
        verify_envelope(encode_envelope(tampered))
