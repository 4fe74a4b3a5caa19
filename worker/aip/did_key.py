"""Ed25519 public keys as AIP names them (`did:key:z6Mk…`) and as NATS does (`U…` nkeys).

AIP (`aip-crypto`) writes a signer as `did:key:z` + base58btc(0xed 0x01 ‖ 32 key bytes): the
multibase prefix `z` is base58btc (Bitcoin alphabet) and 0xed01 the varint multicodec of an
ed25519 public key. A NATS user nkey is base32(prefix byte 0xa0 ‖ the same 32 bytes ‖ CRC16),
and an nkey seed `SU…` carries the 32-byte Ed25519 seed. So one key pair backs both, and
every trust file can list a signer either way: `parse_public_key` reads both into the same
`PublicKey`.

Decoding refuses what upstream refuses (a missing `did:key:z` prefix, another multicodec, a
length other than 32) and, like ed25519-dalek's `VerifyingKey::from_bytes`, 32 bytes that do
not decompress to a curve point.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from dataclasses import dataclass
from typing import Final

import nacl.signing
import nkeys

from worker.aip.errors import InvalidDidKey

DID_KEY_PREFIX: Final = "did:key:z"
ED25519_PUB_MULTICODEC: Final = b"\xed\x01"
_B58_ALPHABET: Final = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX: Final = {char: index for index, char in enumerate(_B58_ALPHABET)}
_USER_NKEY_RE: Final = re.compile(r"U[A-Z2-7]{55}")
#: A did:key of 34 bytes is 47 or 48 base58 characters; anything far longer is not one.
_MAX_DID_LENGTH: Final = 64

# Edwards25519: p = 2^255 - 19, d = -121665/121666.
_P: Final = 2**255 - 19
_D: Final = (-121665 * pow(121666, _P - 2, _P)) % _P


def b58encode(data: bytes) -> str:
    """Base58btc (Bitcoin alphabet): each leading zero byte is a leading `1`."""
    number = int.from_bytes(data, "big")
    out: list[str] = []
    while number:
        number, rest = divmod(number, 58)
        out.append(_B58_ALPHABET[rest])
    zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * zeros + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    """Inverse of `b58encode`; ValueError on a character outside the alphabet."""
    number = 0
    for char in text:
        digit = _B58_INDEX.get(char)
        if digit is None:
            raise ValueError("not base58btc")
        number = number * 58 + digit
    zeros = len(text) - len(text.lstrip("1"))
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    return b"\0" * zeros + body


def _is_curve_point(raw: bytes) -> bool:
    """Whether `raw` decompresses to an Edwards25519 point (curve25519-dalek's rule: y is
    read mod p with the sign bit ignored; valid iff (y²-1)/(d·y²+1) is a square mod p)."""
    y = (int.from_bytes(raw, "little") & ((1 << 255) - 1)) % _P
    u = (y * y - 1) % _P
    v = (_D * y * y + 1) % _P
    x2 = u * pow(v, _P - 2, _P) % _P
    return x2 == 0 or pow(x2, (_P - 1) // 2, _P) == 1


@dataclass(frozen=True, slots=True)
class PublicKey:
    """A 32-byte Ed25519 public key; `did` and `nkey` are its two spellings."""

    raw: bytes

    def __post_init__(self) -> None:
        if len(self.raw) != 32:
            raise InvalidDidKey("an Ed25519 public key is 32 bytes")
        if not _is_curve_point(self.raw):
            raise InvalidDidKey("the 32 bytes are not an Ed25519 curve point")

    @property
    def did(self) -> str:
        return _did_of(self.raw)

    @property
    def nkey(self) -> str:
        """The public user nkey (`U…`) of the same key."""
        return _nkey_of(self.raw)

    @property
    def verify_key(self) -> nacl.signing.VerifyKey:
        return _verify_key(self.raw)

    def __str__(self) -> str:
        return self.did

    @classmethod
    def from_did(cls, did: str) -> PublicKey:
        return public_key_from_did(did)

    @classmethod
    def from_nkey(cls, nkey: str) -> PublicKey:
        return public_key_from_nkey(nkey)


@functools.lru_cache(maxsize=1024)
def _did_of(raw: bytes) -> str:
    return DID_KEY_PREFIX + b58encode(ED25519_PUB_MULTICODEC + raw)


@functools.lru_cache(maxsize=1024)
def _nkey_of(raw: bytes) -> str:
    """Printed once per key: a worker names the trusted signer of every Action it admits by
    this spelling (`TrustedGatewayKeys.signer_of`), and nkeys' CRC-16 is a Python loop
    (~8.5 us a print, ~0.6 % of an operator Action's CPU before it was cached)."""
    body = bytes([nkeys.PREFIX_BYTE_USER]) + raw
    checksum = nkeys.crc16(bytearray(body)).to_bytes(2, "little")
    return base64.b32encode(body + checksum).decode().rstrip("=")


@functools.lru_cache(maxsize=1024)
def _verify_key(raw: bytes) -> nacl.signing.VerifyKey:
    """Built once per key: the same few signers sign every message."""
    return nacl.signing.VerifyKey(raw)


def public_key_from_did(did: str) -> PublicKey:
    """The key a `did:key:z…` names; InvalidDidKey says which of upstream's checks failed."""
    if not isinstance(did, str):
        raise InvalidDidKey("a did:key is a string")
    return _public_key_from_did(did)


@functools.lru_cache(maxsize=1024)
def _public_key_from_did(did: str) -> PublicKey:
    """Decoded once per DID: the same few signers sign every message."""
    if not did.startswith(DID_KEY_PREFIX):
        raise InvalidDidKey("missing did:key prefix (did:key:z…)")
    encoded = did[len(DID_KEY_PREFIX) :]
    if not encoded or len(did) > _MAX_DID_LENGTH:
        raise InvalidDidKey("not an Ed25519 did:key (wrong length)")
    try:
        decoded = b58decode(encoded)
    except ValueError:
        raise InvalidDidKey("the did:key is not base58btc") from None
    if len(decoded) < 2 or decoded[:2] != ED25519_PUB_MULTICODEC:
        raise InvalidDidKey("unsupported did:key multicodec (only ed25519-pub, 0xed01)")
    if len(decoded) != 34:
        raise InvalidDidKey("invalid key length (an Ed25519 did:key holds 32 bytes)")
    return PublicKey(decoded[2:])


def public_key_from_nkey(nkey: str) -> PublicKey:
    """The key of a public user nkey (`U…`, 56 base32 characters with a CRC16)."""
    if not isinstance(nkey, str) or not _USER_NKEY_RE.fullmatch(nkey):
        raise InvalidDidKey("not a public user nkey (56 base32 characters starting with U)")
    raw = base64.b32decode(nkey)
    body, checksum = raw[:-2], raw[-2:]
    if body[0] != nkeys.PREFIX_BYTE_USER:
        raise InvalidDidKey("not a public user nkey (wrong prefix byte)")
    if nkeys.crc16(bytearray(body)) != int.from_bytes(checksum, "little"):
        raise InvalidDidKey("not a public user nkey (checksum mismatch)")
    return PublicKey(bytes(body[1:]))


def parse_public_key(text: str) -> PublicKey:
    """A trust-file entry: a `did:key:z…` or a public user nkey `U…`, the same key either way."""
    if isinstance(text, str) and text.startswith("did:"):
        return public_key_from_did(text)
    if isinstance(text, str) and text.startswith("U"):
        return public_key_from_nkey(text)
    raise InvalidDidKey("neither a did:key:z… nor a public user nkey U…")


def nkey_seed(seed: bytes) -> bytes:
    """The user nkey seed (`SU…`) that carries a raw 32-byte Ed25519 seed."""
    if len(seed) != 32:
        raise InvalidDidKey("an Ed25519 seed is 32 bytes")
    return bytes(nkeys.encode_seed(bytes(seed), nkeys.PREFIX_BYTE_USER))


def seed_from_nkey_seed(seed: bytes | str) -> bytes:
    """The 32-byte Ed25519 seed inside a user nkey seed (`SU…`); InvalidDidKey otherwise."""
    text = seed.encode() if isinstance(seed, str) else bytes(seed)
    text = text.strip()
    if not re.fullmatch(rb"SU[A-Z2-7]{56}", text):
        raise InvalidDidKey("not a user nkey seed (58 base32 characters starting with SU)")
    try:
        prefix, raw = nkeys.decode_seed(bytearray(text))
    except (nkeys.NkeysError, binascii.Error, ValueError):
        raise InvalidDidKey("not a valid user nkey seed") from None
    if prefix != nkeys.PREFIX_BYTE_USER:
        raise InvalidDidKey("not a user nkey seed (wrong prefix byte)")
    return bytes(raw)
