"""The typed failures of AIP 1.0 canonical JSON, did:key and Envelope signatures.

One root, `AipWireError`, so a later caller (the bus edge) catches one class and maps it to
one AIP error code. Every class says its `code` (the AIP `ProtocolError.code` upstream's
gateway answers with), and none is retryable or uncertain: the same bytes fail the same way
again, and nothing was sent or run because of them. Messages name the check that failed,
never a key seed or the signed payload.

    Exception
      AipWireError                  not R, not U
        NotCanonicalizable          a value has no canonical JSON form (signing side)
          UnportableNumber          a number the reference verifier would read back changed
        MalformedJson               received bytes are not the strict JSON serde_json reads
        MalformedEnvelope           not an AIP 1.0 Envelope (shape, version, body, sent_at)
        SignatureError              `auth.signature.invalid`
          MissingSignature          no `security` object, no `security.signature`, or no DID
          MalformedSignature        not standard padded base64 of 64 bytes
          InvalidDidKey             a DID or nkey that is not an Ed25519 did:key / user nkey
          SignerMismatch            `security.did` and `from.did` differ, or not the signer
                                    the caller expected
          BadSignature              the signature does not verify over the canonical bytes

NotCanonicalizable, MalformedJson, MalformedEnvelope and InvalidDidKey are ValueErrors too
(a bad value handed in); tests/unit/test_error_modules.py holds this page to the code.
"""

from __future__ import annotations

SCHEMA_INVALID = "schema.envelope.invalid"
SIGNATURE_INVALID = "auth.signature.invalid"


class AipWireError(Exception):
    """An AIP wire document that cannot be signed, read or trusted; never retryable."""

    code: str = SCHEMA_INVALID
    retryable: bool = False
    uncertain_outcome: bool = False


class NotCanonicalizable(AipWireError, ValueError):
    """A value with no canonical JSON form: NaN, a lone surrogate, a non-string key..."""


class UnportableNumber(NotCanonicalizable):
    """A number the reference verifier would not read back as the same value (strict mode)."""


class MalformedJson(AipWireError, ValueError):
    """Bytes that are not strict JSON as serde_json reads it (the document is refused whole)."""


class MalformedEnvelope(AipWireError, ValueError):
    """A JSON document that is not an AIP 1.0 Envelope."""


class SignatureError(AipWireError):
    """The Envelope's signature cannot be trusted (`auth.signature.invalid`)."""

    code = SIGNATURE_INVALID


class MissingSignature(SignatureError):
    """No `security` object, no `security.signature`, or no DID to verify it with."""


class MalformedSignature(SignatureError):
    """`security.signature` is not standard base64 with padding of 64 bytes."""


class InvalidDidKey(SignatureError, ValueError):
    """Not an Ed25519 `did:key:z…` (or, where accepted, a public user nkey `U…`)."""


class SignerMismatch(SignatureError):
    """The named signer is not the one the Envelope or the caller says it is."""


class BadSignature(SignatureError):
    """The signature does not verify over the Envelope's canonical bytes."""
