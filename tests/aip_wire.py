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
