"""The request fingerprint that binds an approval to exactly one request.

sha256 hex of the canonical JSON (msgspec, keys sorted) of `{capability, input}`. Sorting
makes it independent of how a publisher ordered the keys; anything else in the envelope
(trace, deadline, even `approval`) is deliberately outside it, so a decision survives a
re-publish of the same request but not a changed input or capability.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from schemas.action import Action

_encoder = msgspec.json.Encoder(order="sorted")


def canonical_request(capability: str, request_input: dict[str, Any]) -> bytes:
    return _encoder.encode({"capability": capability, "input": request_input})


def fingerprint_request(action: Action) -> str:
    return hashlib.sha256(canonical_request(action.capability, action.input)).hexdigest()
