"""Trusted signing keys, and the nkey header signature of the subjects not yet on the AIP
wire.

NATS does not tell a subscriber who published. An Action, a Cancel, a DelegationRequest and
a runtime store record carry their own AIP Envelope signature (`worker.wire.*`, checked
against `TrustedGatewayKeys.signer_of`). What is still signed by headers (receipts, DLQ
entries, the gateway's open-children index, …) is checked here: an envelope is
trusted only when header `Aip-Signer` names a key in the trusted gateway key file and header
`Aip-Signature` is that key's signature (base64url, no padding) over the payload as
received. Every failure is the same code, `connector_host.authentication`, with a message
saying which check failed.

A trust file lists each key as a public user nkey (`U…`) or as the `did:key:z…` of the same
Ed25519 key (`worker.aip.did_key.parse_public_key`); either spelling trusts both signature
forms.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import nacl.exceptions
import nacl.signing
import nkeys

from schemas.errors import ErrorCode
from worker.aip.did_key import PublicKey, parse_public_key
from worker.aip.errors import InvalidDidKey
from worker.errors import ConnectorError, TrustConfigError
from worker.secret_files import check_owner_only
from worker.trust.files import read_policy_file

SIGNER_HEADER = "Aip-Signer"
SIGNATURE_HEADER = "Aip-Signature"

_USER_KEY_RE = re.compile(r"U[A-Z2-7]{55}")
#: 64 signature bytes are exactly 86 base64url characters without padding.
_SIGNATURE_RE = re.compile(r"[A-Za-z0-9_-]{86}")
_SEED_RE = re.compile(rb"SU[A-Z2-7]{56}")


def decode_user_public_key(text: str) -> bytes:
    """The raw Ed25519 key of a public user nkey (`U…`); ValueError if it is not one."""
    if not _USER_KEY_RE.fullmatch(text):
        raise ValueError("not a public user nkey (56 base32 characters starting with U)")
    raw = base64.b32decode(text)
    body, checksum = raw[:-2], raw[-2:]
    if body[0] != nkeys.PREFIX_BYTE_USER:
        raise ValueError("not a public user nkey (wrong prefix byte)")
    if nkeys.crc16(body) != int.from_bytes(checksum, "little"):
        raise ValueError("not a public user nkey (checksum mismatch)")
    return bytes(body[1:])


@dataclass(frozen=True, slots=True)
class TrustedGatewayKeys:
    """The public keys whose signatures admit an envelope; several at once allow rotation."""

    #: Public user nkey (`U…`) → its key: the header signatures name the signer so.
    _keys: Mapping[str, nacl.signing.VerifyKey] = field(repr=False)
    #: Public user nkey → the key as its trust file spells it (a `did:key:z…` or the nkey);
    #: a key missing here is named by its nkey.
    _names: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: Path, *, what: str = "trusted gateway keys file") -> TrustedGatewayKeys:
        """One key per line, a `U…` nkey or a `did:key:z…`; `#` starts a comment; blank
        lines are ignored. A key listed twice (in either spelling) is a TrustConfigError.

        The same format lists trusted worker keys (`AIPD_TRUSTED_WORKER_KEYS_FILE`).
        """
        text = read_policy_file(path, what=what).data.decode("utf-8", errors="replace")
        keys: dict[str, nacl.signing.VerifyKey] = {}
        names: dict[str, str] = {}
        first_line: dict[str, int] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            entry = line.split("#", 1)[0].strip()
            if not entry:
                continue
            try:
                public = parse_public_key(entry)
            except InvalidDidKey as exc:
                raise TrustConfigError(f"{what} {path}: line {number}: {exc}") from None
            nkey = public.nkey
            if nkey in first_line:
                raise TrustConfigError(
                    f"{what} {path}: line {number} repeats the key of line {first_line[nkey]}"
                )
            keys[nkey] = public.verify_key
            names[nkey] = entry
            first_line[nkey] = number
        if not keys:
            raise TrustConfigError(f"{what} {path}: holds no key")
        return cls(keys, names)

    @classmethod
    def of(cls, public_keys: Iterable[str]) -> TrustedGatewayKeys:
        """From public keys already known (a worker that trusts its own key when no
        trusted worker keys file is configured): `U…` nkeys or did:keys."""
        parsed = {entry: parse_public_key(entry) for entry in public_keys}
        return cls(
            {key.nkey: key.verify_key for key in parsed.values()},
            {key.nkey: entry for entry, key in parsed.items()},
        )

    def get(self, public_key: str) -> nacl.signing.VerifyKey | None:
        """The key of a public user nkey (`U…`), when it is trusted."""
        return self._keys.get(public_key)

    def signer_of(self, public_key: PublicKey) -> str | None:
        """The trusted key's name as its trust file spells it (a `did:key:z…` or a `U…`
        nkey), or None when `public_key` (an AIP Envelope's verified signer) is not trusted.
        This name is the `signer` receipts record."""
        nkey = public_key.nkey
        if nkey not in self._keys:
            return None
        return self._names.get(nkey, nkey)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def _refuse(reason: str) -> ConnectorError:
    return ConnectorError(ErrorCode.HOST_AUTHENTICATION, f"envelope signature: {reason}")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """The one value of a header, matched case-insensitively (relays may re-case names)."""
    wanted = name.lower()
    found = [value for key, value in headers.items() if key.lower() == wanted]
    if len(found) > 1:
        raise _refuse(f"header {name} is present more than once")
    if not found:
        return None
    if not isinstance(found[0], str):
        raise _refuse(f"header {name} is not text")
    return found[0]


def verify_envelope(payload: bytes, headers: Mapping[str, str], trusted: TrustedGatewayKeys) -> str:
    """The public key of the trusted gateway that signed `payload`; raises ConnectorError."""
    signer = _header(headers, SIGNER_HEADER)
    signature = _header(headers, SIGNATURE_HEADER)
    if signer is None and signature is None:
        raise _refuse("the envelope is unsigned (no Aip-Signer / Aip-Signature headers)")
    if signer is None or signature is None:
        raise _refuse("Aip-Signer and Aip-Signature must be sent together")
    # A trusted key was validated when its file was loaded; only an unknown signer needs
    # decoding, to say whether it is malformed or merely untrusted.
    key = trusted.get(signer)
    if key is None:
        try:
            decode_user_public_key(signer)
        except ValueError as exc:
            raise _refuse(f"Aip-Signer is {exc}") from None
    if not _SIGNATURE_RE.fullmatch(signature):
        raise _refuse("Aip-Signature is not 86 base64url characters without padding")
    raw_signature = base64.urlsafe_b64decode(signature + "==")
    if base64.urlsafe_b64encode(raw_signature).rstrip(b"=").decode() != signature:
        raise _refuse("Aip-Signature is not canonical base64url")
    if key is None:
        raise _refuse(f"signer {signer} is not a trusted gateway key")
    try:
        key.verify(payload, raw_signature)
    except nacl.exceptions.BadSignatureError:
        raise _refuse(f"the signature of {signer} does not match the payload") from None
    return signer


def sign_envelope(payload: bytes, seed: bytes) -> dict[str, str]:
    """The two headers that make `payload` a signed envelope (the gateway's side)."""
    pair = _user_pair(seed)
    signature = pair.sign(payload)
    return {
        SIGNER_HEADER: pair.public_key.decode(),
        SIGNATURE_HEADER: base64.urlsafe_b64encode(signature).rstrip(b"=").decode(),
    }


def public_key_of(seed: bytes) -> str:
    """The public user nkey (`U…`) of a seed; ValueError if it is not a user seed."""
    return str(_user_pair(seed).public_key.decode())


def sign_detached(payload: bytes, seed: bytes) -> str:
    """The seed's Ed25519 signature over `payload`, base64url without padding."""
    return base64.urlsafe_b64encode(_user_pair(seed).sign(payload)).rstrip(b"=").decode()


def verify_detached(payload: bytes, signature: str, public_key: str) -> None:
    """Raise ValueError unless `signature` is `public_key`'s signature over `payload`."""
    if not _SIGNATURE_RE.fullmatch(signature):
        raise ValueError("the signature is not 86 base64url characters without padding")
    raw = base64.urlsafe_b64decode(signature + "==")
    key = _verify_key(public_key)
    try:
        key.verify(payload, raw)
    except nacl.exceptions.BadSignatureError:
        raise ValueError("the signature does not match") from None


@functools.lru_cache(maxsize=1024)
def _verify_key(public_key: str) -> nacl.signing.VerifyKey:
    """The key of a public user nkey, decoded once: the same few approvers and workers
    sign every record (ValueError, not cached, when it is not a user nkey)."""
    return nacl.signing.VerifyKey(decode_user_public_key(public_key))


def _user_pair(seed: bytes) -> nkeys.KeyPair:
    seed = seed.strip()
    if not _SEED_RE.fullmatch(seed):
        raise ValueError("not a user nkey seed (58 base32 characters starting with SU)")
    try:
        return nkeys.from_seed(bytearray(seed))
    except (nkeys.NkeysError, binascii.Error):
        raise ValueError("not a valid user nkey seed") from None


@dataclass(frozen=True, slots=True)
class GatewayKeyPair:
    """A fresh signing key: the seed stays on the gateway, the public key goes to workers."""

    seed: bytes = field(repr=False)
    public_key: str


def generate_keypair() -> GatewayKeyPair:
    seed = bytes(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER))
    return GatewayKeyPair(seed=seed, public_key=_user_pair(seed).public_key.decode())


def write_seed_file(path: Path, seed: bytes) -> None:
    """Create `path` owner-only (0600) with the seed; an existing file is never overwritten."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(seed + b"\n")


def read_seed_file(path: Path, *, what: str = "gateway seed file") -> bytes:
    """A signing seed from an owner-only file (a gateway's, an approver's, the demo's)."""
    check_owner_only(path, what=what)
    seed = path.read_bytes().strip()
    _user_pair(seed)
    return seed
