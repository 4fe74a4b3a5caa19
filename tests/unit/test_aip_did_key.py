"""did:key for Ed25519 (worker/aip/did_key.py), and the nkey spellings of the same key."""

from __future__ import annotations

from typing import Any

import nacl.signing
import nkeys
import pytest

from worker.aip.did_key import (
    PublicKey,
    b58decode,
    b58encode,
    nkey_seed,
    parse_public_key,
    public_key_from_did,
    public_key_from_nkey,
    seed_from_nkey_seed,
)
from worker.aip.errors import InvalidDidKey, SignatureError
from worker.aip.signing import AipSigner
from worker.trust.signing import decode_user_public_key


def test_zero_seed_gives_the_published_did_key_vector() -> None:
    # The did:key method's Ed25519 test vector for the all-zero seed.
    assert (
        AipSigner.from_seed(bytes(32)).did
        == "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp"
    )


def test_did_key_round_trips_seed_7_like_upstream() -> None:
    # aip-crypto `did_key_round_trips`: seed [7; 32].
    signer = AipSigner.from_seed(bytes([7]) * 32)
    assert signer.did.startswith("did:key:z6Mk")
    assert public_key_from_did(signer.did) == signer.public_key
    assert signer.public_key.raw == bytes(nacl.signing.SigningKey(bytes([7]) * 32).verify_key)


def test_the_nkey_and_the_did_key_name_one_key() -> None:
    seed = bytes(nkeys.encode_seed(bytes([7]) * 32, nkeys.PREFIX_BYTE_USER))
    pair = nkeys.from_seed(bytearray(seed))
    nkey = pair.public_key.decode()
    signer = AipSigner.from_nkey_seed(seed)
    assert signer.public_key.nkey == nkey
    assert parse_public_key(nkey) == parse_public_key(signer.did) == signer.public_key
    assert public_key_from_nkey(nkey).raw == decode_user_public_key(nkey)
    assert seed_from_nkey_seed(seed.decode()) == bytes([7]) * 32
    assert nkey_seed(bytes([7]) * 32) == seed
    assert AipSigner.from_nkey_seed(seed).did == AipSigner.from_seed(bytes([7]) * 32).did


def test_base58_keeps_leading_zero_bytes() -> None:
    assert b58encode(b"\0\0\x01") == "112"
    assert b58decode("112") == b"\0\0\x01"
    assert b58decode(b58encode(bytes(range(40)))) == bytes(range(40))


def _did(payload: bytes) -> str:
    return "did:key:z" + b58encode(payload)


GOOD = AipSigner.from_seed(bytes([9]) * 32).public_key


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("did:web:example.com", "prefix"),
        ("did:key:" + GOOD.did[len("did:key:z") :], "prefix"),  # multibase must be z
        ("did:key:z", "length"),
        ("did:key:z0OIl", "base58"),
        (_did(b"\xe7\x01" + bytes(33)), "multicodec"),  # secp256k1-pub
        (_did(b"\xed\x01" + GOOD.raw[:31]), "length"),
        (_did(b"\xed\x01" + GOOD.raw + b"\0"), "length"),
    ],
)
def test_malformed_did_keys_are_refused(text: str, reason: str) -> None:
    with pytest.raises(InvalidDidKey, match=reason):
        public_key_from_did(text)


def test_bytes_that_are_no_curve_point_are_refused() -> None:
    not_a_point = next(
        bytes([index]) + bytes(31)
        for index in range(2, 256)
        if not _decompresses(bytes([index]) + bytes(31))
    )
    with pytest.raises(InvalidDidKey, match="curve point"):
        public_key_from_did(_did(b"\xed\x01" + not_a_point))


def _decompresses(raw: bytes) -> bool:
    try:
        PublicKey(raw)
    except InvalidDidKey:
        return False
    return True


@pytest.mark.parametrize(
    "text",
    [
        GOOD.nkey[:-1] + ("A" if GOOD.nkey[-1] != "A" else "B"),  # checksum
        "A" + GOOD.nkey[1:],  # an account key is no signer here
        GOOD.nkey.lower(),
        "",
        "ed25519:abc",
        7,
    ],
)
def test_malformed_nkeys_and_other_text_are_refused(text: Any) -> None:
    with pytest.raises(InvalidDidKey):
        parse_public_key(text)


def test_invalid_did_key_is_a_signature_error_and_a_value_error() -> None:
    error = InvalidDidKey("x")
    assert isinstance(error, SignatureError)
    assert isinstance(error, ValueError)
    assert error.code == "auth.signature.invalid"
    assert not error.retryable
    assert not error.uncertain_outcome


@pytest.mark.parametrize("seed", [b"SA" + b"A" * 56, b"SU" + b"A" * 55, b"not a seed"])
def test_only_user_nkey_seeds_make_a_signer(seed: bytes) -> None:
    with pytest.raises(InvalidDidKey):
        AipSigner.from_nkey_seed(seed)


def test_a_did_that_is_not_text_is_refused() -> None:
    with pytest.raises(InvalidDidKey):
        public_key_from_did(["did:key:z6Mk"])
