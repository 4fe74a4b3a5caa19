"""A DelegationRequest's child Action cannot claim where it arrived from."""

from __future__ import annotations

import json

import pytest

from schemas.codec import decode_delegation
from schemas.errors import EnvelopeRejected, ErrorCode

REQUEST = {
    "delegation_id": "dlg_1",
    "delegator": {"principal_id": "agent:a", "principal_kind": "agent"},
    "delegate": "agent:hermes_operator:h1",
    "action": {
        "id": "act_" + "1" * 32,
        "capability": "cap:other:x",
        "input": {},
        "identity": {"principal_id": "agent:a", "principal_kind": "agent"},
        "created_at_unix_ms": 1_700_000_000_000,
    },
    "chain": ["agent:a"],
    "scopes": ["read"],
    "created_at_unix_ms": 1_700_000_000_000,
}


def test_a_child_action_without_received_decodes() -> None:
    assert decode_delegation(json.dumps(REQUEST).encode()).action.received is None


def test_a_child_action_claiming_received_is_refused() -> None:
    claimed = {**REQUEST, "action": {**REQUEST["action"], "received": {"message_id": "msg_1"}}}
    with pytest.raises(EnvelopeRejected) as caught:
        decode_delegation(json.dumps(claimed).encode())
    assert caught.value.code is ErrorCode.SCHEMA_ENVELOPE_INVALID
    assert "received" in caught.value.reason
