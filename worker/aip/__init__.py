"""AIP 1.0 wire primitives: canonical JSON, did:key, and Envelope signatures.

Self-contained and not yet on the bus: nothing in the worker's pipeline imports it. The
rules are restated from the public reference implementation (`getaip/core`, see
docs/publishing.md, "AIP 1.0 signing"); `tests/vectors/aip/` pins the bytes.
"""

from worker.aip.canonical import canonical_bytes, format_float, loads, portability_problems
from worker.aip.did_key import PublicKey, parse_public_key
from worker.aip.envelope import format_timestamp, now_timestamp
from worker.aip.errors import (
    AipWireError,
    BadSignature,
    InvalidDidKey,
    MalformedEnvelope,
    MalformedJson,
    MalformedSignature,
    MissingSignature,
    NotCanonicalizable,
    SignatureError,
    SignerMismatch,
    UnportableNumber,
)
from worker.aip.signing import (
    AipSigner,
    VerifiedEnvelope,
    encode_envelope,
    sign_envelope,
    sign_value,
    signing_bytes,
    verify_envelope,
    verify_value,
)

__all__ = [
    "AipSigner",
    "AipWireError",
    "BadSignature",
    "InvalidDidKey",
    "MalformedEnvelope",
    "MalformedJson",
    "MalformedSignature",
    "MissingSignature",
    "NotCanonicalizable",
    "PublicKey",
    "SignatureError",
    "SignerMismatch",
    "UnportableNumber",
    "VerifiedEnvelope",
    "canonical_bytes",
    "encode_envelope",
    "format_float",
    "format_timestamp",
    "loads",
    "now_timestamp",
    "parse_public_key",
    "portability_problems",
    "sign_envelope",
    "sign_value",
    "signing_bytes",
    "verify_envelope",
    "verify_value",
]
