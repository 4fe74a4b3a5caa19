"""Reading the results and chunks subjects the way a consumer in another language would:
plain JSON and the layout docs/publishing.md gives ("ActionResult", "StreamChunk"), nothing
from the project's codec (`worker.wire.*`), so a test that reads through these checks the
wire, not the codec against itself.

`chunk_view` / `result_view` flatten one Envelope into the project's field names
(`seq`, `prev_sha256`, `last_chunk_sha256`…) for tests that check behaviour, not layout.
"""

from __future__ import annotations

import json
from typing import Any

OURS = "org.aip-hermes-worker"


def envelope(data: bytes) -> dict[str, Any]:
    value = json.loads(data)
    assert isinstance(value, dict), "an Envelope is a JSON object"
    return value


def extension(env: dict[str, Any]) -> dict[str, Any]:
    return dict(env.get("extensions", {}).get(OURS, {}))


def chunk_view(data: bytes) -> dict[str, Any]:
    """A `stream_chunk` Envelope as `{action_id, seq, kind, payload, provider_event,
    prev_sha256, run_id, endpoint_id, ts_unix_ms, part}`."""
    env = envelope(data)
    assert env["message_type"] == "aip.core.v1.stream_chunk", env["message_type"]
    body = env["body"]["stream_chunk"]
    ext = extension(env)
    (form, value), = body["data"].items()
    if form == "hermes_sse":
        provider_event, payload = value["event"], value.get("data")
    else:
        assert form in ("hermes_operator", "hermes_worker"), form
        provider_event, payload = ext.get("provider_event"), value
    return {
        "action_id": body["action_id"],
        "seq": body["sequence"],
        "kind": body["kind"],
        "payload": payload,
        "provider_event": provider_event,
        "part": body.get("part"),
        "prev_sha256": ext.get("prev_sha256"),
        "run_id": ext.get("run_id"),
        "endpoint_id": ext["endpoint_id"],
        "ts_unix_ms": ext["ts_unix_ms"],
    }


def result_view(data: bytes) -> dict[str, Any]:
    """An `action_result` Envelope as the project's result fields (`error` in AIP's
    ProtocolError form), plus `signer_did` (None when unsigned)."""
    env = envelope(data)
    assert env["message_type"] == "aip.core.v1.action_result", env["message_type"]
    body = env["body"]["action_result"]
    ext = extension(env)
    security = env.get("security") or {}
    return {
        "action_id": body["action_id"],
        "status": body["status"],
        "output": body.get("output"),
        "error": body.get("error"),
        **ext,
        "in_response_to": env.get("in_response_to"),
        "signer_did": security.get("did") if "signature" in security else None,
    }


def dead_letter_envelope(
    *,
    dlq_id: str,
    endpoint_id: str,
    kept: bytes,
    seed: int | None,
    action_id: str | None = None,
    code: str = "schema.envelope.invalid",
    category: str = "permanent",
) -> bytes:
    """A DLQ entry built from the rules alone (docs/publishing.md "The dead-letter queue"):
    an `aip.lifecycle.v1.action_status` Envelope in state `dead_lettered` from the
    endpoint's worker, our facts in the extension, signed by the key of `seed` (PyNaCl over
    the canonical JSON; None: unsigned)."""
    import base64
    import hashlib

    from tests.vectors.aip.make_vectors import canonical, signed

    envelope: dict[str, Any] = {
        "aip_version": "1.0",
        "message_type": "aip.lifecycle.v1.action_status",
        "message_id": "msg_" + dlq_id.removeprefix("dlq_"),
        "sent_at": "2026-01-01T00:00:00Z",
        "from": {"id": f"agent:hermes_operator:{endpoint_id}", "kind": "agent"},
        "body": {
            "action_status": {
                "action_id": action_id or dlq_id,
                "state": "dead_lettered",
                "updated_at": "2026-01-01T00:00:00Z",
            }
        },
        "extensions": {
            OURS: {
                "dead_letter": {
                    "dlq_id": dlq_id,
                    "endpoint_id": endpoint_id,
                    "code": code,
                    "category": category,
                    "reason": "built by hand",
                    "subject": f"aip.hermes.{endpoint_id}.actions",
                    "stream_seq": 1,
                    "worker_id": "w-forger",
                    "size": len(kept),
                    "sha256": hashlib.sha256(kept).hexdigest(),
                    "kept": base64.b64encode(kept).decode(),
                }
            }
        },
    }
    if seed is None:
        return canonical(envelope)
    return canonical(signed(envelope, seed)[0])


#: Our events with an AIP receipt type of their own (docs/publishing.md "Audit receipts").
RECEIPT_TYPES = {
    "received": "request_received",
    "admitted": "action_accepted",
    "provider_request": "tool_executed",
    "tool_call": "tool_executed",
    "settled": "result_returned",
}


def _timestamp(unix_ms: int) -> str:
    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(unix_ms / 1000, UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    millis = unix_ms % 1000
    return text + (f".{millis:03d}".rstrip("0") if millis else "") + "Z"


def aip_receipt(fields: dict[str, Any]) -> dict[str, Any]:
    """Our receipt's fields (`receipt_id`, `event`, … and `prev_sha256`) as the AIP Receipt
    the rules make of them: id, type, actor, time, data, previous_hash, and the hash over
    the canonical JSON of the rest (aip-1.0-wire.md §1.15, §2.7)."""
    import hashlib

    from tests.vectors.aip.make_vectors import canonical

    data = {k: v for k, v in fields.items() if k != "prev_sha256" and v is not None}
    data.setdefault("fence", 0)
    data.setdefault("details", {})
    out: dict[str, Any] = {
        "id": "rcpt_" + hashlib.sha256(fields["receipt_id"].encode()).hexdigest()[:32],
        "receipt_type": RECEIPT_TYPES.get(fields["event"], "policy_decision"),
        "actor": {"id": fields["worker_id"], "kind": "service"},
        "occurred_at": _timestamp(fields["ts_unix_ms"]),
        "data": data,
    }
    if fields.get("prev_sha256") is not None:
        out["previous_hash"] = fields["prev_sha256"]
    out["hash"] = hashlib.sha256(canonical(out)).hexdigest()
    return out


def receipt_envelope(fields: dict[str, Any], *, seed: int | None) -> bytes:
    """One receipt's `aip.audit.v1.receipt_chain` Envelope built from the rules alone,
    signed by the key of `seed` with PyNaCl (None: unsigned)."""
    import hashlib

    from tests.vectors.aip.make_vectors import canonical, signed

    linked = aip_receipt(fields)
    envelope: dict[str, Any] = {
        "aip_version": "1.0",
        "message_type": "aip.audit.v1.receipt_chain",
        "message_id": "msg_" + linked["id"].removeprefix("rcpt_"),
        "sent_at": linked["occurred_at"],
        "from": dict(linked["actor"]),
        "body": {
            "receipt_chain": {
                "chain_id": fields["action_id"],
                "receipts": [linked],
                "root_hash": hashlib.sha256(linked["hash"].encode()).hexdigest(),
            }
        },
    }
    if seed is None:
        return canonical(envelope)
    return canonical(signed(envelope, seed)[0])


def receipt_fields(data: bytes) -> dict[str, Any]:
    """Our receipt's fields read back from its Envelope by hand (`prev_sha256` = the AIP
    receipt's `previous_hash`)."""
    env = envelope(data)
    assert env["message_type"] == "aip.audit.v1.receipt_chain", env["message_type"]
    (linked,) = env["body"]["receipt_chain"]["receipts"]
    return {**linked["data"], "prev_sha256": linked.get("previous_hash")}
