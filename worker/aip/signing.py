"""Sign and verify AIP 1.0 Envelopes as upstream's gateway does (`sign_native_envelope`,
`verify_native_envelope_signature`, `aip-crypto::sign_envelope`).

Signing sets `from` to the signer's Principal with its `did`, makes `security` an object,
drops any `security.signature`, sets `security.did`, and signs with Ed25519 the canonical
JSON (`canonical.py`) of the Envelope in its typed form (`envelope.py`) without
`security.signature`; the signature goes into `security.signature` as standard base64
with `=` padding. Every other `security` key (`trust_domain`, `connector_route`, …) stays
and is covered.

Verification re-derives those bytes from what it *decoded* (so whitespace, key order,
escapes and number spelling on the wire do not matter), with the DID from `security.did`
or else `from.did`. It is stricter than upstream in two places, both fail-closed: a
`from.did` that differs from `security.did` is refused (upstream ignores `from.did` when
`security.did` is present), and a repeated JSON key is refused. Which DIDs to trust, and
the Principal each is bound to, is the caller's decision: `expected=` pins one key.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import nacl.exceptions
import nacl.signing

from worker.aip.canonical import (
    canonical_bytes,
    is_plain,
    loads,
    plain_bytes,
    require_portable,
)
from worker.aip.did_key import (
    PublicKey,
    parse_public_key,
    public_key_from_did,
    seed_from_nkey_seed,
)
from worker.aip.envelope import check_envelope, typed_form, untyped_differences
from worker.aip.errors import (
    BadSignature,
    InvalidDidKey,
    MalformedEnvelope,
    MalformedSignature,
    MissingSignature,
    NotCanonicalizable,
    SignerMismatch,
)

#: 64 signature bytes are 86 standard base64 characters and `==`.
_SIGNATURE_RE: Final = re.compile(r"[A-Za-z0-9+/]{86}==")


@dataclass(frozen=True, slots=True)
class AipSigner:
    """An Ed25519 signing key and the public key AIP names it by; the seed never shows."""

    _key: nacl.signing.SigningKey = field(repr=False)
    public_key: PublicKey

    @classmethod
    def from_seed(cls, seed: bytes) -> AipSigner:
        """From the raw 32-byte Ed25519 seed (upstream's `signing_key_from_seed`)."""
        if len(seed) != 32:
            raise InvalidDidKey("an Ed25519 seed is 32 bytes")
        key = nacl.signing.SigningKey(bytes(seed))
        return cls(key, PublicKey(bytes(key.verify_key)))

    @classmethod
    def from_nkey_seed(cls, seed: bytes | str) -> AipSigner:
        """From a user nkey seed (`SU…`), the key files this project already keeps."""
        return cls.from_seed(seed_from_nkey_seed(seed))

    @property
    def did(self) -> str:
        return self.public_key.did

    def sign(self, data: bytes) -> str:
        """Standard base64, padded, of the Ed25519 signature over `data`."""
        return base64.b64encode(self._key.sign(data).signature).decode("ascii")


@dataclass(frozen=True, slots=True)
class VerifiedEnvelope:
    """An Envelope whose signature verified, and the key that made it."""

    envelope: dict[str, Any]
    did: str
    public_key: PublicKey


def decode_signature(signature: Any) -> bytes:
    """The 64 bytes of a `security.signature`; MalformedSignature unless it is canonical
    standard base64 with padding (the base64 crate's STANDARD engine refuses the rest)."""
    if not isinstance(signature, str) or not _SIGNATURE_RE.fullmatch(signature):
        raise MalformedSignature("security.signature is not 88 characters of padded base64")
    raw = base64.b64decode(signature, validate=True)
    if base64.b64encode(raw).decode("ascii") != signature:
        raise MalformedSignature("security.signature has non-zero trailing bits")
    return raw


def signing_bytes(envelope: Mapping[str, Any]) -> bytes:
    """The bytes an Envelope's signature covers: its typed form without
    `security.signature`, canonicalised."""
    check_envelope(envelope)
    return _signing_bytes(envelope)


def _signing_bytes(envelope: Mapping[str, Any]) -> bytes:
    typed = typed_form(envelope)
    security = typed.get("security")
    if isinstance(security, Mapping) and "signature" in security:
        typed["security"] = {key: value for key, value in security.items() if key != "signature"}
    return canonical_bytes(typed)


def sign_envelope(
    envelope: Mapping[str, Any],
    signer: AipSigner,
    principal: Mapping[str, Any],
    *,
    require_portable_numbers: bool = False,
) -> dict[str, Any]:
    """A signed copy of `envelope`, sent by `principal` (`{"id", "kind", …}`).

    The Envelope must already be in upstream's serialized form, or a verifier would sign
    other bytes: absent optionals omitted (never `null`), `sent_at` RFC 3339 UTC ending in
    `Z` as the time crate writes it (`format_timestamp`). MalformedEnvelope names what is
    not. `require_portable_numbers` also refuses numbers the reference verifier would read
    back changed (`canonical.portability_problems`).
    """
    return _signed(
        envelope, signer, principal, require_portable_numbers=require_portable_numbers
    )[0]


def _signed(
    envelope: Mapping[str, Any],
    signer: AipSigner,
    principal: Mapping[str, Any],
    *,
    require_portable_numbers: bool,
) -> tuple[dict[str, Any], bool]:
    """`sign_envelope`'s signed copy, and whether it is plain JSON (`is_plain`)."""
    claimed = principal.get("did")
    if claimed is not None and claimed != signer.did:
        raise SignerMismatch("the principal's did is not the signer's did:key")
    signed = dict(envelope)
    signed["from"] = {**principal, "did": signer.did}
    security = signed.get("security")
    if security is None:
        security = {}
    if not isinstance(security, Mapping):
        raise MalformedEnvelope("security must be an object to carry a signature")
    security = {key: value for key, value in security.items() if key != "signature"}
    security["did"] = signer.did
    signed["security"] = security
    check_envelope(signed)
    differences = untyped_differences(signed)
    if differences:
        raise MalformedEnvelope(
            f"not in the form upstream re-serializes ({', '.join(differences)}): omit absent "
            "optionals and empty lists, write timestamps as the time crate renders RFC 3339"
        )
    if not signed["sent_at"].endswith("Z"):
        raise MalformedEnvelope("sent_at must be an RFC 3339 UTC timestamp ending in Z")
    if require_portable_numbers:
        require_portable(signed)
    plain = is_plain(signed)
    security["signature"] = signer.sign(plain_bytes(signed) if plain else canonical_bytes(signed))
    return signed, plain


def signed_bytes(
    envelope: Mapping[str, Any],
    signer: AipSigner,
    principal: Mapping[str, Any],
) -> bytes:
    """The wire bytes (canonical JSON) of `sign_envelope(envelope, signer, principal)`,
    the document walked once for what plain JSON cannot print: the signature the second
    printing adds is a plain string, so what was plain before it stays plain."""
    signed, plain = _signed(envelope, signer, principal, require_portable_numbers=False)
    return plain_bytes(signed) if plain else canonical_bytes(signed)


def encode_envelope(envelope: Mapping[str, Any]) -> bytes:
    """Wire bytes for an Envelope: its canonical JSON, the bytes a verifier rebuilds."""
    return canonical_bytes(envelope)


def verify_envelope(
    data: bytes | str | Mapping[str, Any],
    *,
    expected: PublicKey | str | None = None,
) -> VerifiedEnvelope:
    """Check a received Envelope's AIP signature; `expected` (a did:key, a `U…` nkey or a
    PublicKey) pins the signer. Raises the typed errors of `worker.aip.errors`."""
    envelope: Any = dict(data) if isinstance(data, Mapping) else loads(data)
    check_envelope(envelope)
    return verify_checked(envelope, expected=expected)


def verify_checked(
    envelope: dict[str, Any], *, expected: PublicKey | str | None = None
) -> VerifiedEnvelope:
    """`verify_envelope` of an Envelope the caller decoded and held to the Envelope rules
    (`check_envelope`) itself, as `worker.wire.envelopes.open_envelope` does: the rules
    are not checked a second time. The VerifiedEnvelope holds `envelope` itself."""
    security = envelope.get("security")
    if not isinstance(security, Mapping):
        raise MissingSignature("the Envelope has no security object")
    if security.get("signature") is None:
        raise MissingSignature("the Envelope has no security.signature")
    raw_signature = decode_signature(security["signature"])
    sender = envelope.get("from")
    from_did = sender.get("did") if isinstance(sender, Mapping) else None
    did = security.get("did")
    if did is None:
        did = from_did
    if did is None:
        raise MissingSignature("no did:key in security.did or from.did")
    if not isinstance(did, str):
        raise InvalidDidKey("security.did is not a string")
    key = public_key_from_did(did)
    if from_did is not None and from_did != did:
        raise SignerMismatch("from.did is not security.did")
    if expected is not None:
        wanted = expected if isinstance(expected, PublicKey) else parse_public_key(expected)
        if wanted != key:
            raise SignerMismatch(f"signed by {did}, not by the expected {wanted.did}")
    try:
        message = _signing_bytes(envelope)  # checked above
    except NotCanonicalizable as exc:  # only a Mapping handed in can hold a non-JSON value
        raise MalformedEnvelope(str(exc)) from None
    try:
        key.verify_key.verify(message, raw_signature)
    except nacl.exceptions.BadSignatureError:
        raise BadSignature(f"the signature of {did} does not match the Envelope") from None
    return VerifiedEnvelope(envelope=envelope, did=did, public_key=key)


def sign_value(value: Any, signer: AipSigner) -> str:
    """A control-plane signature: over the canonical JSON of `value` as is (`sign_value`)."""
    return signer.sign(canonical_bytes(value))


def verify_value(value: Any, signature: str, key: PublicKey | str) -> None:
    """Raise BadSignature (or MalformedSignature) unless `signature` signs `value`."""
    public_key = key if isinstance(key, PublicKey) else parse_public_key(key)
    raw = decode_signature(signature)
    try:
        public_key.verify_key.verify(canonical_bytes(value), raw)
    except nacl.exceptions.BadSignatureError:
        raise BadSignature("the signature does not match the value") from None


__all__ = [
    "AipSigner",
    "VerifiedEnvelope",
    "decode_signature",
    "encode_envelope",
    "sign_envelope",
    "sign_value",
    "signed_bytes",
    "signing_bytes",
    "verify_checked",
    "verify_envelope",
    "verify_value",
]
