"""The Action ⇄ AIP Action Envelope mapping (`worker/wire/actions.py`, docs/publishing.md
"The Action"): where each of our fields lands, checked by reading the published JSON
against the table and the signature with PyNaCl over the canonical form written by the
rules (`tests/aip_actions.py`), then decoded back."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import msgspec
import nacl.signing
import pytest

from schemas.action import Action, DelegationRef, Identity, Mode, Trace
from schemas.aip.approval import ApprovalDecision
from schemas.errors import EnvelopeRejected, ErrorCode
from tests.aip_actions import SENDER, action_envelope, canonical, did_of, sign
from worker.aip.signing import AipSigner
from worker.wire.actions import GATEWAY_SENDER, decode_action, encode_action

SEED = bytes(range(32))
KEY = nacl.signing.SigningKey(SEED)
SIGNER = AipSigner.from_seed(SEED)
ACTION_ID = "act_" + "ab" * 16
#: An AIP ApprovalDecision as the rules write it (absent optionals omitted).
APPROVAL: dict[str, Any] = {
    "approval_id": "appr_" + "ab" * 16,
    "decision": "approved",
    "approver": {"id": "approver:carol", "kind": "human"},
    "decided_at": "2026-12-06T01:59:00Z",
    "reason": "ticket OPS-7",
    "evidence": [
        {"id": "input:apr_" + "1" * 32, "kind": "input_snapshot", "redacted": False,
         "hash": "sha256:" + "f" * 64}
    ],
    "decision_id": "apr_" + "1" * 32,
}  # fmt: skip


def _action(**changes: Any) -> Action:
    action = Action(
        id=ACTION_ID,
        capability="cap:hermes_agent:h1:chat",
        input={"messages": [{"role": "user", "content": "café ✓"}], "temperature": 0.5},
        identity=Identity(
            principal_id="user:alice",
            principal_kind="user",
            tenant_id="tenant-a",
            authentication_issuer="https://idp.example.test",
            credential_revision=3,
        ),
        created_at_unix_ms=1_796_522_400_123,
        mode=Mode.STREAM,
        idempotency_key="idem-1",
        timeout_ms=30_000,
        deadline_unix_ms=1_796_522_500_000,
        trace=Trace(trace_id="trace-1", correlation_id="corr-1"),
        approval=msgspec.convert(APPROVAL, ApprovalDecision),
        delegation=DelegationRef(delegation_id="dlg-1", chain=["user:root", "user:alice"]),
        conversation={"id": "conv_" + "c" * 32, "channel": {"thread": "t"}, "status": "open"},
        memory={"notes": ["keep"]},
        callback={"profile": "aip.native.nats.v1", "target": "reply.subject"},
        observability={"span_id": "span-1"},
        compliance={"regimes": ["gdpr"]},
        transaction={"mode": "dry_run"},
    )
    return msgspec.structs.replace(action, **changes) if changes else action


def test_every_field_lands_where_the_table_says_and_the_signature_is_aips() -> None:
    wire = encode_action(_action(), signer=SIGNER, sender=GATEWAY_SENDER)
    envelope = json.loads(wire)
    assert wire == canonical(envelope)  # published in canonical form
    assert envelope["aip_version"] == "1.0"
    assert envelope["message_type"] == "aip.core.v1.action"
    assert envelope["message_id"] == "msg_" + "ab" * 16
    assert envelope["sent_at"] == "2026-12-06T02:00:00.123Z"
    assert envelope["correlation_id"] == "corr-1"
    assert envelope["from"] == {**GATEWAY_SENDER, "did": did_of(KEY)}
    assert envelope["extensions"] == {
        "org.aip-hermes-worker": {
            "created_at_unix_ms": 1_796_522_400_123,
            "deadline_unix_ms": 1_796_522_500_000,
            "delegation": {"delegation_id": "dlg-1", "chain": ["user:root", "user:alice"]},
        }
    }
    assert envelope["body"] == {
        "action": {
            "id": ACTION_ID,
            "capability_id": "cap:hermes_agent:h1:chat",
            "input": {"messages": [{"role": "user", "content": "café ✓"}], "temperature": 0.5},
            "mode": "streaming",
            "idempotency_key": "idem-1",
            "timeout_ms": 30_000,
            "identity": {
                "tenant": {"id": "tenant-a"},
                "human_actor": {
                    "id": "user:alice",
                    "kind": "human",
                    "auth_context": {
                        "issuer": "https://idp.example.test",
                        "credential_revision": 3,
                        "principal_kind": "user",
                    },
                },
            },
            "observability": {"span_id": "span-1", "trace_id": "trace-1"},
            "memory_context": {"notes": ["keep"]},
            "conversation": {
                "id": "conv_" + "c" * 32,
                "channel": {"thread": "t"},
                "status": "open",
            },
            "callback": {"profile": "aip.native.nats.v1", "target": "reply.subject"},
            "compliance": {"regimes": ["gdpr"]},
            "transaction": {"mode": "dry_run"},
            "approval": APPROVAL,
        }
    }
    # The signature, by the rules: Ed25519 over the canonical Envelope without it.
    unsigned = copy.deepcopy(envelope)
    signature = base64.b64decode(unsigned["security"].pop("signature"))
    assert unsigned["security"] == {"did": did_of(KEY)}
    KEY.verify_key.verify(canonical(unsigned), signature)
    # The rule-built signer, given the same Envelope, writes the very same bytes.
    bare = {k: v for k, v in envelope.items() if k not in ("from", "security")}
    assert canonical(sign(bare, KEY, dict(GATEWAY_SENDER))) == wire


def test_a_decoded_envelope_is_the_action_it_was_made_of() -> None:
    action = _action()
    decoded, opened = decode_action(encode_action(action, signer=SIGNER, sender=GATEWAY_SENDER))
    assert opened.verified is not None
    assert opened.verified.did == did_of(KEY)
    assert decoded.received is not None
    assert decoded.received.message_id == "msg_" + "ab" * 16
    assert decoded.received.sender == {**GATEWAY_SENDER, "did": did_of(KEY)}
    assert msgspec.structs.replace(decoded, received=None) == action


@pytest.mark.parametrize(
    ("kind", "aip_kind", "slot"),
    [
        ("human", "human", "human_actor"),
        ("user", "human", "human_actor"),
        ("agent", "agent", "service_account"),
        ("service", "service", "service_account"),
        ("unknown", "service", "service_account"),
    ],
)
def test_principal_kinds_travel_as_aip_kinds_and_come_back_as_ours(
    kind: str, aip_kind: str, slot: str
) -> None:
    action = _action(identity=Identity(principal_id="p:1", principal_kind=kind))
    envelope = json.loads(encode_action(action, signer=None, sender=SENDER))
    principal = envelope["body"]["action"]["identity"][slot]
    assert principal["kind"] == aip_kind
    assert principal.get("auth_context", {}).get("principal_kind") == (
        None if kind == aip_kind else kind
    )
    decoded, _ = decode_action(canonical(envelope))
    assert decoded.identity == action.identity


def test_an_aip_clients_envelope_takes_its_creation_time_from_sent_at() -> None:
    envelope = action_envelope(principal="user:alice")
    envelope["sent_at"] = "2026-12-06T02:00:00.5Z"
    action, _ = decode_action(canonical(sign(envelope, KEY)))
    assert action.created_at_unix_ms == 1_796_522_400_500
    assert action.mode is Mode.ASYNC


def test_an_approved_aip_decision_in_the_body_is_the_actions_approval() -> None:
    envelope = action_envelope(principal="user:alice")
    approval = {
        "approval_id": "appr_" + "2" * 32,
        "decision": "approved",
        "approver": {"id": "approver:carol", "kind": "human"},
        "decided_at": "2026-12-06T01:59:00Z",
        "decision_id": "apr_" + "3" * 32,
    }
    envelope["body"]["action"]["approval"] = approval
    action, _ = decode_action(canonical(sign(envelope, KEY)))
    assert action.approval is not None
    assert msgspec.to_builtins(action.approval) == approval
    for bad in (
        {**approval, "decision": "denied"},  # AIP: only an approved decision rides an Action
        {**approval, "decided_by": "me"},  # closed: an unknown field
        {key: value for key, value in approval.items() if key != "approver"},
    ):
        envelope["body"]["action"]["approval"] = bad
        with pytest.raises(EnvelopeRejected) as caught:
            decode_action(canonical(sign(envelope, KEY)))
        assert caught.value.code is ErrorCode.SCHEMA_ENVELOPE_INVALID


@pytest.mark.parametrize(
    "change",
    [
        {"conversation": {"thread": "t-1"}},  # not the AIP Conversation
        {"callback": {"url": "x"}},
        {"transaction": {"mode": "sometimes"}},
        {"trace": Trace(trace_id="a"), "observability": {"trace_id": "b"}},
        {"created_at_unix_ms": 10**18},
    ],
)
def test_an_action_that_cannot_travel_is_refused_before_it_is_signed(
    change: dict[str, Any],
) -> None:
    with pytest.raises(EnvelopeRejected) as caught:
        encode_action(_action(**change), signer=SIGNER, sender=GATEWAY_SENDER)
    assert caught.value.code is ErrorCode.SCHEMA_ENVELOPE_INVALID


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        (lambda e: e["extensions"]["org.aip-hermes-worker"].update(surprise=1), "schema"),
        (lambda e: e["body"]["action"].update(timeout_ms=86_400_001), "schema"),
        (lambda e: e["body"]["action"].update(input=[1, 2]), "schema"),
        (lambda e: e["body"]["action"].update(memory_context="text"), "schema"),
        (lambda e: e["body"]["action"]["identity"].pop("human_actor"), "schema"),
        (
            lambda e: e["body"]["action"]["identity"].update(
                service_account={"id": "svc", "kind": "service"}
            ),
            "schema",
        ),
        (
            lambda e: e["body"]["action"]["identity"]["human_actor"]["auth_context"].update(
                principal_kind="agent"
            ),
            "schema",
        ),
        (lambda e: e.update(message_type="aip.core.v1.cancel"), "schema"),
    ],
)
def test_an_envelope_our_action_cannot_hold_is_refused_with_its_code(
    edit: Any, code: str
) -> None:
    envelope = json.loads(encode_action(_action(), signer=None, sender=SENDER))
    edit(envelope)
    with pytest.raises(EnvelopeRejected) as caught:
        decode_action(canonical(sign(envelope, KEY)))
    assert caught.value.code is ErrorCode.SCHEMA_ENVELOPE_INVALID, caught.value.reason
    assert code == "schema"
