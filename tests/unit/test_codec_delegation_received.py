"""A DelegationRequest's child Action cannot claim where it arrived from: `received` is set
by the Action decoder from the Envelope it decoded, and the delegation wire has no place
for a publisher to write it (the AIP Action is closed, our extension objects too)."""

from __future__ import annotations

import json

import pytest

from schemas.action import DelegationRef, Identity
from schemas.delegation import ChildAction, DelegationRequest
from schemas.errors import EnvelopeRejected, ErrorCode
from worker.wire.actions import GATEWAY_SENDER
from worker.wire.delegations import decode_delegation, encode_delegation

CHAIN = ["agent:a"]
REQUEST = DelegationRequest(
    delegation_id="dlg_1",
    delegator=Identity(principal_id="agent:a", principal_kind="agent"),
    delegate="agent:hermes_operator:h1",
    action=ChildAction(
        id="act_" + "1" * 32,
        capability="cap:other:x",
        input={},
        identity=Identity(principal_id="agent:hermes_operator:h1", principal_kind="agent"),
        created_at_unix_ms=1_700_000_000_000,
        delegation=DelegationRef(
            delegation_id="dlg_1", parent_action_id="act_" + "2" * 32, chain=CHAIN
        ),
    ),
    chain=CHAIN,
    scopes=["read"],
    created_at_unix_ms=1_700_000_000_000,
)


def sealed() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(
        encode_delegation(REQUEST, signer=None, sender=GATEWAY_SENDER)
    )
    return loaded


def test_a_child_action_without_received_decodes() -> None:
    data = json.dumps(sealed()).encode()
    assert decode_delegation(data)[0].action.received is None


@pytest.mark.parametrize("where", ["child_action", "extension_child"])
def test_a_child_action_claiming_received_is_refused(where: str) -> None:
    envelope = sealed()
    claim = {"message_id": "msg_1"}
    if where == "child_action":
        body = envelope["body"]["delegation_request"]  # type: ignore[index]
        body["child_action"]["received"] = claim
    else:
        envelope["extensions"]["org.aip-hermes-worker"]["child"]["received"] = claim  # type: ignore[index]
    with pytest.raises(EnvelopeRejected) as caught:
        decode_delegation(json.dumps(envelope).encode())
    assert caught.value.code is ErrorCode.SCHEMA_ENVELOPE_INVALID
    assert "received" in caught.value.reason
