"""The chunks subject's wire: an internal chunk (`schemas/chunk.py`) as an unsigned AIP
`aip.core.v1.stream_chunk` Envelope, and back (docs/publishing.md "StreamChunk").

Chunks are not signed one by one (an Ed25519 signature per provider event on the hot
path): each names, in our extension's `prev_sha256`, the sha256 of the exact bytes of the
chunk before it as published, and the signed result names the last one
(`last_chunk_sha256`), so one signature covers the whole chain.

The body is AIP's StreamChunk: `sequence` is our `seq`, `kind` the same values, and
`data` one of three objects with a single key, so a reader knows whose facts it holds:

- `{"hermes_sse": {"event": provider_event, "data": payload}}` for a route operation's
  provider event (upstream's form, §4.6; `data` omitted when there is none);
- `{"hermes_operator": payload}` for the operator's chunks (upstream's form, §4.9), the
  provider event, when there is one, in the extension's `provider_event`;
- `{"hermes_worker": payload}` for a chunk the worker makes itself (the terminal chunk
  made from a result, a refusal's, an idempotent replay's).

Only a streaming capability's Action has chunks (`worker.pipeline.settle`).

A `data` chunk whose payload carries a text `delta` also carries it as a text `part`.

The encoding is a function of the chunk alone: `message_id` is derived from the chunk's
place in its chain and `sent_at` is its `ts_unix_ms`, so encoding one chunk twice (a
re-send, the chain head's record) gives the same bytes, and the same hash.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

import msgspec

from schemas.aip.extensions import ChunkExtension
from schemas.aip.messages import open_body
from schemas.aip.stream import StreamChunk as AipStreamChunk
from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from worker.aip.canonical import canonical_bytes, is_plain, plain_bytes
from worker.aip.envelope import AIP_VERSION, BODY_KEYS
from worker.wire.actions import timestamp_of_ms
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    EXTENSION_KEY,
    Opened,
    extension_as,
    invalid,
    open_envelope,
    open_payload,
)
from worker.wire.results import worker_principal

CHUNK_TYPE: Final = "aip.core.v1.stream_chunk"
_TYPES: Final = frozenset({CHUNK_TYPE})
SSE_KEY: Final = "hermes_sse"
OPERATOR_KEY: Final = "hermes_operator"
WORKER_KEY: Final = "hermes_worker"
_FORMS: Final = frozenset({SSE_KEY, OPERATOR_KEY, WORKER_KEY})
_BODY_KEY: Final = BODY_KEYS[CHUNK_TYPE]


class _SseData(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    event: str
    data: Any = None


def chunk_message_id(chunk: StreamChunk, kind: ChunkKind | None = None) -> str:
    """`msg_` + a UUIDv7-shaped id: the chunk's milliseconds, then 74 bits of the sha256 of
    its place in the chain (Action, seq, predecessor, kind): the same chunk, the same id."""
    kind = kind or chunk.kind
    place = f"{chunk.action_id}:{chunk.seq}:{chunk.prev_sha256 or ''}:{kind.value}"
    # 48 bits of milliseconds, then 80 bits of the hash, as bytes: the version nibble (7)
    # is the high half of byte 6, the variant bits (10) the top of byte 8.
    raw = bytearray((chunk.ts_unix_ms & _MS_MASK).to_bytes(6, "big"))
    raw += hashlib.sha256(place.encode()).digest()[:10]
    raw[6] = (raw[6] & 0x0F) | 0x70
    raw[8] = (raw[8] & 0x3F) | 0x80
    return "msg_" + raw.hex()


_MS_MASK: Final = 2**48 - 1


def _data(chunk: StreamChunk, operator: bool) -> dict[str, Any]:
    payload = msgspec.to_builtins(chunk.payload)
    if operator:
        return {OPERATOR_KEY: payload}
    if chunk.provider_event is not None:
        sse: dict[str, Any] = {"event": chunk.provider_event}
        if payload is not None:
            sse["data"] = payload
        return {SSE_KEY: sse}
    return {WORKER_KEY: payload}


def chunk_body(chunk: StreamChunk, *, operator: bool = False) -> dict[str, Any]:
    """The AIP StreamChunk of `chunk` (the `stream_chunk` body): also what the connector
    host forwards to a central callback (worker/gateway/connector_stream.py)."""
    return _body(chunk, chunk.kind, operator)


def _body(chunk: StreamChunk, kind: ChunkKind, operator: bool) -> dict[str, Any]:
    """`chunk_body`, its kind already read (`StreamChunk.kind` builds the enum each time)."""
    payload: dict[str, Any] = {
        "action_id": chunk.action_id,
        "sequence": chunk.seq,
        "kind": kind.value,
        "data": _data(chunk, operator),
    }
    if kind is ChunkKind.DATA and isinstance(chunk.payload, dict):
        delta = chunk.payload.get("delta")
        if isinstance(delta, str) and delta:
            payload["part"] = {"type": "text", "text": delta}
    return payload


def encode_chunk(chunk: StreamChunk, *, operator: bool = False) -> bytes:
    """The wire bytes of `chunk`: an unsigned `stream_chunk` Envelope from the worker of
    its endpoint (`operator`: a chunk of the operator capability).

    The bytes `seal` prints for this frame (`tests/unit/test_wire_chunk_frame.py` holds the
    two equal), framed here without `seal`'s general checks: every member but the chunk's
    payload is a string or integer this function writes itself, in the form the Envelope
    rules ask, so only the body is walked for what plain JSON cannot print. A chunk per
    provider event: the checks and copies were ~40 % of its framing CPU (bench figure 3)."""
    kind = chunk.kind
    payload = _body(chunk, kind, operator)
    extension: dict[str, Any] = {"endpoint_id": chunk.endpoint_id, "ts_unix_ms": chunk.ts_unix_ms}
    if chunk.prev_sha256 is not None:
        extension["prev_sha256"] = chunk.prev_sha256
    if chunk.run_id is not None:
        extension["run_id"] = chunk.run_id
    if operator and chunk.provider_event is not None:
        extension["provider_event"] = chunk.provider_event
    envelope = {
        "aip_version": AIP_VERSION,
        "message_type": CHUNK_TYPE,
        "message_id": chunk_message_id(chunk, kind),
        "sent_at": timestamp_of_ms(chunk.ts_unix_ms),  # per-second cached, one per chunk
        "body": {_BODY_KEY: payload},
        "extensions": {EXTENSION_KEY: extension},
        "from": worker_principal(chunk.endpoint_id),
    }
    if is_plain(payload) and is_plain(extension):
        return plain_bytes(envelope)
    return canonical_bytes(envelope)  # the exact printer: the payload holds more than plain JSON


def decode_chunk(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[StreamChunk, Opened]:
    """The internal chunk in `data` and its Envelope; EnvelopeRejected for anything else
    (`envelope.decode.invalid` or `schema.envelope.invalid`)."""
    opened = open_envelope(data, message_types=_TYPES, max_bytes=max_bytes)
    body = open_payload(opened, CHUNK_TYPE)
    assert isinstance(body, AipStreamChunk)
    extension = extension_as(opened, ChunkExtension)
    data_ = body.data
    if not isinstance(data_, dict) or len(data_) != 1 or next(iter(data_)) not in _FORMS:
        raise invalid(f"stream_chunk.data must be one of {{{', '.join(sorted(_FORMS))}: …}}")
    ((form, value),) = data_.items()
    provider_event = extension.provider_event
    payload = value
    if form == SSE_KEY:
        try:
            sse = msgspec.convert(value, _SseData, strict=True)
        except msgspec.ValidationError as exc:
            raise invalid(f"stream_chunk.data.hermes_sse: {exc}") from None
        provider_event, payload = sse.event, sse.data
    try:
        kind = ChunkKind(body.kind.value)
    except ValueError:
        raise invalid(f"chunk kind {body.kind.value!r} is not one this connector emits") from None
    return (
        make_chunk(
            kind,
            action_id=body.action_id,
            endpoint_id=extension.endpoint_id,
            seq=body.sequence,
            ts_unix_ms=extension.ts_unix_ms,
            payload=payload,
            provider_event=provider_event,
            run_id=extension.run_id,
            prev_sha256=extension.prev_sha256,
        ),
        opened,
    )


__all__ = [
    "CHUNK_TYPE",
    "OPERATOR_KEY",
    "SSE_KEY",
    "WORKER_KEY",
    "chunk_message_id",
    "decode_chunk",
    "encode_chunk",
]


def aip_chunk_of(data: bytes) -> AipStreamChunk:
    """The AIP StreamChunk (`body.stream_chunk`) of chunk Envelope bytes already opened
    (`decode_chunk`), as AIP 1.0's own type (`schemas/aip/stream.py`): `sequence`, `kind`,
    `data` in upstream's forms and the text `part`, none of our extension's facts."""
    body = open_body(CHUNK_TYPE, json.loads(data)["body"])
    assert isinstance(body, AipStreamChunk)
    return body
