"""Every request fingerprint, and what each one binds.

All three are sha256 hex over canonical JSON (msgspec, keys sorted, no whitespace), so the
order in which a publisher wrote its keys changes none of them. They hash different fields
because each answers a different question:

| fingerprint | hashes | a mismatch means |
|---|---|---|
| `approval_fingerprint` | capability, input, principal id, credential revision | the approval decision was made for another request, or for another principal (or before its credential was rotated) |
| `idempotency_fingerprint` | capability, input, delegation | the Action id was reused for another request: an idempotency collision |
| `operator_fingerprint` | endpoint id, input, delegation | the operator Action's id was reused with one of the three changed (spec "Fence provider start"): a collision |

Anything else in the envelope (trace, deadline, even `approval`) is deliberately outside
all three, so a re-publish of the same request matches and a changed one does not.
"""  # noqa: E501 - the table reads better unwrapped

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from schemas.action import Action

_encoder = msgspec.json.Encoder(order="sorted")


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: one byte string per JSON value."""
    return _encoder.encode(value)


def canonical_request(capability: str, request_input: dict[str, Any]) -> bytes:
    """What an approval binds, as bytes: also the input snapshot an approver reads."""
    return canonical_json({"capability": capability, "input": request_input})


def approval_fingerprint(action: Action) -> str:
    """The `input_fingerprint` of an approval record: {capability, input} and whose request
    it is ({principal id, credential revision}). An approval is consumed by the principal it
    was given to: an Action of another principal under the approved id (or of the same one
    after its credential was rotated) does not match, so it cannot run on it."""
    material = {
        "capability": action.capability,
        "input": action.input,
        "principal_id": action.identity.principal_id,
        "credential_revision": action.identity.credential_revision,
    }
    return hashlib.sha256(canonical_json(material)).hexdigest()


def idempotency_fingerprint(action: Action) -> str:
    """Kept with an Action id's lease: {capability, input, delegation}."""
    material = {
        "capability": action.capability,
        "input": action.input,
        "delegation": msgspec.to_builtins(action.delegation),
    }
    return hashlib.sha256(canonical_json(material)).hexdigest()


def operator_fingerprint(endpoint_id: str, action: Action) -> str:
    """The operator binding's `request_fingerprint`: {endpoint id, input, delegation}."""
    material = {
        "endpoint_id": endpoint_id,
        "input": action.input,
        "delegation": msgspec.to_builtins(action.delegation),
    }
    return hashlib.sha256(canonical_json(material)).hexdigest()
