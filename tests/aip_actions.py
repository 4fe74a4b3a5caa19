"""AIP 1.0 Action Envelopes built from the published rules alone, for tests that check the
project's Action wire against AIP (shared/reference/aip-1.0-wire.md §1.1, §1.2, §2).

Independent of the project's codec: the Envelope is a hand-written dict, canonicalised as
serde_json prints it (sorted keys, no whitespace, UTF-8 as is; the values the tests use
print the same in Python's `json`), and signed with PyNaCl. It imports nothing from
`worker/` or `schemas/`.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
from datetime import UTC, datetime
from typing import Any

import nacl.signing
import nkeys

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
#: The `from` Principal the test gateway signs as.
SENDER = {"id": "service:test-gateway", "kind": "service"}


def b58(data: bytes) -> str:
    """Base58btc (Bitcoin alphabet), each leading zero byte a leading `1`."""
    number, out = int.from_bytes(data, "big"), ""
    while number:
        number, rest = divmod(number, 58)
        out = _B58[rest] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def did_of(key: nacl.signing.SigningKey) -> str:
    """`did:key:z` + base58btc(0xed 0x01 ‖ the 32-byte public key) (§2.5)."""
    return "did:key:z" + b58(b"\xed\x01" + bytes(key.verify_key))


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def key_of_nkey_seed(seed: bytes) -> nacl.signing.SigningKey:
    """The Ed25519 key inside a user nkey seed (`SU…`): the gateway's key files."""
    _, raw = nkeys.decode_seed(bytearray(seed.strip()))
    return nacl.signing.SigningKey(bytes(raw))


def action_envelope(
    *,
    endpoint: str = "h1",
    operation: str = "models",
    input: Any = None,
    principal: str = "user:demo",
    principal_kind: str = "user",
    issuer: str | None = None,
    revision: int | None = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """An unsigned `aip.core.v1.action` Envelope (§1.1) carrying an Action (§1.2). The
    principal is a `human_actor` whose `auth_context` carries the issuer, the credential
    revision and the project's own kind word (docs/publishing.md, Action)."""
    action_id = "act_" + secrets.token_hex(16)
    auth: dict[str, Any] = {"principal_kind": principal_kind}
    if issuer is not None:
        auth["issuer"] = issuer
    if revision is not None:
        auth["credential_revision"] = revision
    actor = {"id": principal, "kind": "human", "auth_context": auth}
    identity: dict[str, Any] = {"human_actor": actor}
    if tenant is not None:
        identity["tenant"] = {"id": tenant}
    return {
        "aip_version": "1.0",
        "message_type": "aip.core.v1.action",
        "message_id": "msg_" + secrets.token_hex(16),
        "sent_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "body": {
            "action": {
                "id": action_id,
                "capability_id": f"cap:hermes_agent:{endpoint}:{operation}",
                "input": {} if input is None else input,
                "mode": "async",
                "idempotency_key": action_id,
                "identity": identity,
            }
        },
    }


def sign(
    envelope: dict[str, Any],
    key: nacl.signing.SigningKey,
    sender: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """§2.2: `from` (`sender`, default `SENDER`) and `security.did` name the key (any other
    `security` key of `envelope` is kept); the signature (standard base64, padded) is over
    the canonical Envelope without `security.signature`."""
    signed = copy.deepcopy(envelope)
    did = did_of(key)
    signed["from"] = {**(sender or SENDER), "did": did}
    # Other `security` keys (a pinned `connector_route`, …) stay, and are signed.
    security = {k: v for k, v in (envelope.get("security") or {}).items() if k != "signature"}
    signed["security"] = {**security, "did": did}
    signature = key.sign(canonical(signed)).signature
    signed["security"]["signature"] = base64.b64encode(signature).decode()
    return signed


def cancel_envelope(
    action_id: str, *, reason: str | None = None, wait_ms: int | None = None
) -> dict[str, Any]:
    """An unsigned `aip.core.v1.cancel` Envelope (§1.1, §1.8) of `action_id`; `sign` it
    with the requester as `sender` (the Cancel's `from` is who asks)."""
    cancel: dict[str, Any] = {"target": {"action": action_id}}
    if reason is not None:
        cancel["reason"] = reason
    envelope: dict[str, Any] = {
        "aip_version": "1.0",
        "message_type": "aip.core.v1.cancel",
        "message_id": "msg_" + secrets.token_hex(16),
        "sent_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "correlation_id": "corr_" + secrets.token_hex(16),
        "body": {"cancel": cancel},
    }
    if wait_ms is not None:
        envelope["extensions"] = {"org.aip-hermes-worker": {"wait_ms": wait_ms}}
    return envelope


def request_envelope(message_type: str, body: dict[str, Any]) -> dict[str, Any]:
    """An unsigned Envelope of `message_type` (§1.1) whose body is `body` under the type's
    last segment (`aip.core.v1.heartbeat` → `body.heartbeat`), with a fresh `message_id`,
    `sent_at` and `correlation_id`: a native binding request before `sign`."""
    return {
        "aip_version": "1.0",
        "message_type": message_type,
        "message_id": "msg_" + secrets.token_hex(16),
        "sent_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "correlation_id": "corr_" + secrets.token_hex(8),
        "body": {message_type.rsplit(".", 1)[1]: body},
    }


def action_of(envelope: dict[str, Any]) -> dict[str, Any]:
    """The Envelope's `body.action`."""
    action: dict[str, Any] = envelope["body"]["action"]
    return action


def delegation_request_envelope(
    *,
    endpoint: str = "h1",
    capability: str = "cap:support_sandbox:case.get",
    input: Any = None,
    requested_by: str = "user:demo",
    issuer: str = "https://idp.example.test",
    revision: int = 3,
    scope: str = "support.read",
) -> dict[str, Any]:
    """An unsigned `aip.agent.v1.delegation_request` Envelope (§1.1, §1.12) as a GetAIP
    runtime's delegation route sends it (§3.4): `correlation_id` set, `to` the delegate, the
    child Action issued to the delegate (`agent:hermes_operator:{endpoint}`) with its one
    DelegationEntry (requester → delegate). `sign` it with the runtime's key and principal."""
    delegate = {"id": f"agent:hermes_operator:{endpoint}", "kind": "agent"}
    child_id = "act_" + secrets.token_hex(16)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    human = {"id": requested_by, "kind": "human"}
    return {
        "aip_version": "1.0",
        "message_type": "aip.agent.v1.delegation_request",
        "message_id": "msg_" + secrets.token_hex(16),
        "sent_at": now,
        "correlation_id": "corr_" + secrets.token_hex(16),
        "to": dict(delegate),
        "body": {
            "delegation_request": {
                "delegation_id": "dlg_" + secrets.token_hex(16),
                "parent_action_id": "act_" + secrets.token_hex(16),
                "child_action": {
                    "id": child_id,
                    "capability_id": capability,
                    "input": {"case_id": "case-2030"} if input is None else input,
                    "mode": "async",
                    "idempotency_key": child_id,
                    "timeout_ms": 60_000,
                    "identity": {"service_account": dict(delegate)},
                    "delegation_chain": [
                        {"from": human, "to": dict(delegate), "scope": scope, "delegated_at": now}
                    ],
                },
                "requested_by": {
                    **human,
                    "auth_context": {
                        "principal_kind": "user",
                        "issuer": issuer,
                        "credential_revision": revision,
                    },
                },
                "delegate": dict(delegate),
                "scope": scope,
            }
        },
    }
