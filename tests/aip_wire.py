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
