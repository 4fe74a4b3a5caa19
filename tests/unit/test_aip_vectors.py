"""The AIP 1.0 vectors (tests/vectors/aip/, README there): the project's codec must
reproduce bytes written out by hand, did:keys and signatures computed without it, and
interoperate with a minimal signer written here from the rules alone (stdlib `json`,
`base64` and the Ed25519 library; nothing from `worker/aip` builds the expected side)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.signing
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.aip import (
    AipSigner,
    BadSignature,
    canonical_bytes,
    encode_envelope,
    loads,
    sign_envelope,
    sign_value,
    signing_bytes,
    verify_envelope,
    verify_value,
)
from worker.aip.did_key import public_key_from_did

VECTORS = Path(__file__).parents[1] / "vectors" / "aip"
CANONICAL = json.loads((VECTORS / "canonical.json").read_text("utf-8"))["cases"]
KEYS = json.loads((VECTORS / "did_key.json").read_text("utf-8"))["keys"]
SIGNATURES = json.loads((VECTORS / "signatures.json").read_text("utf-8"))
ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


# --- a minimal AIP signer and verifier, from the rules (docs/publishing.md) --------------


def rules_b58(data: bytes) -> str:
    number, out = int.from_bytes(data, "big"), ""
    while number:
        number, rest = divmod(number, 58)
        out = ALPHABET[rest] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def rules_b58_decode(text: str) -> bytes:
    number = 0
    for char in text:
        number = number * 58 + ALPHABET.index(char)
    return number.to_bytes(34, "big")


def rules_did(seed: bytes) -> str:
    return "did:key:z" + rules_b58(b"\xed\x01" + bytes(nacl.signing.SigningKey(seed).verify_key))


def rules_canonical(value: Any) -> bytes:
    # Valid for documents whose floats Python's repr spells as serde_json does (no
    # exponent between -5 and -9): the ones used with it below.
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def rules_sign(envelope: dict[str, Any], seed: bytes, principal: dict[str, Any]) -> bytes:
    did = rules_did(seed)
    envelope = {**envelope, "from": {**principal, "did": did}}
    security = {k: v for k, v in (envelope.get("security") or {}).items() if k != "signature"}
    envelope["security"] = {**security, "did": did}
    signature = nacl.signing.SigningKey(seed).sign(rules_canonical(envelope)).signature
    envelope["security"]["signature"] = base64.b64encode(signature).decode()
    return json.dumps(envelope, indent=1).encode()  # any valid encoding will do


def rules_verify(data: bytes) -> str:
    envelope = json.loads(data)
    signature = base64.b64decode(envelope["security"].pop("signature"), validate=True)
    did = envelope["security"].get("did") or envelope["from"]["did"]
    raw = rules_b58_decode(did.removeprefix("did:key:z"))
    assert raw[:2] == b"\xed\x01"
    nacl.signing.VerifyKey(raw[2:]).verify(rules_canonical(envelope), signature)
    return str(did)


# --- the vector files -------------------------------------------------------------------


@pytest.mark.parametrize("case", CANONICAL, ids=[case["name"] for case in CANONICAL])
def test_canonical_bytes_match_the_hand_written_vectors(case: dict[str, str]) -> None:
    assert canonical_bytes(loads(case["input"].encode("utf-8"))) == case["expected"].encode()


@pytest.mark.parametrize("entry", KEYS, ids=[f"seed {entry['seed']}" for entry in KEYS])
def test_did_keys_of_the_upstream_seeds(entry: dict[str, Any]) -> None:
    seed = bytes.fromhex(entry["seed_hex"])
    assert bytes(nacl.signing.SigningKey(seed).verify_key).hex() == entry["public_key_hex"]
    assert rules_did(seed) == entry["did"]
    assert AipSigner.from_seed(seed).did == entry["did"]
    assert public_key_from_did(entry["did"]).raw.hex() == entry["public_key_hex"]


def test_the_zero_seed_vector_is_the_published_one() -> None:
    zero = next(entry for entry in KEYS if entry["seed"] == 0)
    assert zero["did"] == "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp"


def test_the_ed25519_library_is_rfc_8032() -> None:
    # RFC 8032 §7.1 TEST 1, which ed25519-dalek (upstream) also passes.
    key = nacl.signing.SigningKey(
        bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    )
    assert bytes(key.verify_key).hex() == (
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    )
    assert key.sign(b"").signature.hex() == (
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555f"
        "b8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    )


@pytest.mark.parametrize("vector", SIGNATURES["values"], ids=lambda vector: vector["name"])
def test_value_signatures(vector: dict[str, Any]) -> None:
    signer = AipSigner.from_seed(bytes([vector["seed"]]) * 32)
    assert canonical_bytes(vector["value"]) == vector["canonical"].encode()
    raw = base64.b64decode(vector["signature"], validate=True)
    signer.public_key.verify_key.verify(vector["canonical"].encode(), raw)
    assert sign_value(vector["value"], signer) == vector["signature"]
    verify_value(vector["value"], vector["signature"], vector["did"])


ENVELOPES = SIGNATURES["envelopes"]


@pytest.mark.parametrize("vector", ENVELOPES, ids=lambda vector: vector["name"])
def test_envelope_signatures(vector: dict[str, Any]) -> None:
    literal = vector["signing_bytes"].encode("utf-8")
    signed = vector["signed_envelope"]
    # Independent: the literal signature is Ed25519 over the literal bytes.
    key = nacl.signing.VerifyKey(rules_b58_decode(vector["did"][len("did:key:z") :])[2:])
    key.verify(literal, base64.b64decode(vector["signature"], validate=True))
    # Ours rebuilds those bytes, verifies the stored (non-canonical) spelling and its own.
    assert signing_bytes(signed) == literal
    stored = json.dumps(signed, ensure_ascii=True).encode()  # 1e-05, \u00fc...: not canonical
    assert verify_envelope(stored, expected=vector["did"]).did == vector["did"]
    assert verify_envelope(encode_envelope(signed)).did == vector["did"]
    # And signing the same Envelope reproduces the signature (Ed25519 is deterministic).
    principal = {k: v for k, v in signed["from"].items() if k != "did"}
    security = {k: v for k, v in signed["security"].items() if k not in ("did", "signature")}
    unsigned = {k: v for k, v in signed.items() if k not in ("from", "security")}
    if security:
        unsigned["security"] = security
    signer = AipSigner.from_seed(bytes([vector["seed"]]) * 32)
    again = sign_envelope(unsigned, signer, principal)
    assert again["security"]["signature"] == vector["signature"]


@pytest.mark.parametrize("vector", ENVELOPES, ids=lambda vector: vector["name"])
def test_envelope_vectors_fail_when_a_signed_value_changes(vector: dict[str, Any]) -> None:
    text = json.dumps(vector["signed_envelope"], ensure_ascii=False)
    tampered = text.replace("00000000000000000000000000000", "00000000000000000000000000001", 1)
    assert tampered != text
    with pytest.raises(BadSignature):
        verify_envelope(tampered.encode())


# --- interoperability with the rules-only signer ------------------------------------------

GATEWAY = {"id": "service:getaip:gateway", "kind": "service"}
SEED_22 = bytes([22]) * 32

safe_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.sampled_from([0.5, 2.5, -1.25, 100.0, 3.14, 1e21, 1.5e300, -0.0])
    | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=12,
)


def action(value: Any) -> dict[str, Any]:
    return {
        "aip_version": "1.0",
        "message_type": "aip.core.v1.action",
        "message_id": "msg_00000000000000000000000000000022",
        "sent_at": "2026-12-01T00:00:02Z",
        "security": {"trust_domain": "example.com"},
        "body": {
            "action": {
                "id": "act_00000000000000000000000000000022",
                "capability_id": "cap:test:interop",
                "input": {"value": value, "text": "naïve café ☕"},
            }
        },
    }


@settings(max_examples=100)
@given(safe_values)
def test_a_rules_only_signer_and_ours_accept_each_other(value: Any) -> None:
    theirs = rules_sign(action(value), SEED_22, GATEWAY)
    assert verify_envelope(theirs).did == rules_did(SEED_22)
    ours = encode_envelope(sign_envelope(action(value), AipSigner.from_seed(SEED_22), GATEWAY))
    assert rules_verify(ours) == rules_did(SEED_22)
    # Both sign the same bytes, so the same signature.
    assert json.loads(theirs)["security"]["signature"] == json.loads(ours)["security"]["signature"]


def test_the_rules_only_verifier_rejects_a_tampered_envelope_of_ours() -> None:
    ours = json.loads(
        encode_envelope(sign_envelope(action(1), AipSigner.from_seed(SEED_22), GATEWAY))
    )
    ours["body"]["action"]["input"]["value"] = 2
    with pytest.raises(nacl.exceptions.BadSignatureError):
        rules_verify(json.dumps(ours).encode())
