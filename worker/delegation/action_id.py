"""The Action id a delegation runs under on this bus.

A delegation is not an Action of its own, yet it needs everything an Action has here: a
lease, a fenced result, a chunk stream, a cancel subject and an operator binding. It gets them
under an id derived from its `delegation_id` alone, so every redelivery and every worker
derives the same one, and reusing a delegation id with another child, endpoint or chain is an
idempotency collision on that id (the binding's fingerprint covers all three). It cannot be
the child's own id: the child is executed, leased and settled by whoever serves its
capability, possibly on this very bus.
"""

from __future__ import annotations

import hashlib

_DOMAIN = b"aip-hermes-worker/delegation/v1\x00"


def delegation_action_id(delegation_id: str) -> str:
    """`act_` + the first 32 hex digits of sha256(domain || delegation_id)."""
    return "act_" + hashlib.sha256(_DOMAIN + delegation_id.encode("utf-8")).hexdigest()[:32]
