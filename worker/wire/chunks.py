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
from typing import Any, Final

import msgspec

from schemas.aip.extensions import ChunkExtension
from schemas.aip.messages import open_body
from schemas.aip.stream import StreamChunk as AipStreamChunk
from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from worker.aip import canonical
from worker.aip.canonical import PLAIN_ENCODER, canonical_bytes, is_plain, plain_bytes
from worker.aip.envelope import AIP_VERSION, BODY_KEYS
from worker.aip.errors import NotCanonicalizable
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


class ChunkFramer:
    """`encode_chunk` for the chunks of one Action, with what they all share printed once.

    A relayed run makes a chunk per provider event (figure 3 of the benchmark: tens of
    thousands a second), and framing each as a dict of dicts printed by the sorted encoder
    was the largest part of the worker's own CPU per chunk. The Envelope's members are
    printed in canonical (sorted) order whatever their values, so the bytes every chunk of
    one Action shares (the version, the Action and endpoint ids, the sender, the message
    type) are printed once here, and a chunk's own members (its kind, data, text part,
    sequence, predecessor, run, time, message id) are printed and spliced between them. A
    chunk whose facts are not all of the types the splice prints exactly (a payload that is
    not plain JSON, an id that is not a `str`) is framed by `encode_chunk` itself, so the
    bytes are `encode_chunk`'s in every case (`tests/unit/test_wire_chunk_frame.py`); the
    milliseconds' `sent_at` and message-id prefix are kept for the next chunk of the same
    millisecond."""

    __slots__ = (
        "_data_head",
        "_event",
        "_event_printed",
        "_extension_head",
        "_from_head",
        "_id_hash",
        "_ms",
        "_ms_id",
        "_ms_sent_at",
        "_run_id",
        "_run_id_json",
        "_spliced",
        "action_id",
        "endpoint_id",
        "operator",
    )

    def __init__(self, action_id: str, endpoint_id: str, *, operator: bool = False) -> None:
        self.action_id = action_id
        self.endpoint_id = endpoint_id
        self.operator = operator
        #: False when the shared facts cannot be printed by the splice: every chunk then
        #: goes through `encode_chunk`, which prints or refuses them as it always has.
        self._spliced = type(action_id) is str and type(endpoint_id) is str
        self._data_head = self._extension_head = self._from_head = b""
        if self._spliced:
            try:
                self._data_head = b"".join((
                    b'{"aip_version":', plain_bytes(AIP_VERSION),
                    b',"body":{', plain_bytes(_BODY_KEY),
                    b':{"action_id":', plain_bytes(action_id), b',"data":',
                ))
                self._extension_head = b"".join((
                    b'}},"extensions":{', plain_bytes(EXTENSION_KEY),
                    b':{"endpoint_id":', plain_bytes(endpoint_id),
                ))
                self._from_head = b"".join((
                    b'}},"from":', plain_bytes(worker_principal(endpoint_id)),
                    b',"message_id":"msg_',
                ))
            except NotCanonicalizable:
                self._spliced = False
        #: sha256 of `{action_id}:`, the common start of every chunk's place in the chain
        #: (`chunk_message_id`): copied and completed per chunk.
        self._id_hash = hashlib.sha256(f"{action_id}:".encode())
        self._ms = -1
        self._ms_id = ""
        self._ms_sent_at = b""
        self._run_id: str | None = None
        self._run_id_json = b""
        self._event: str | None = None
        self._event_printed = b""

    def frame(
        self,
        kind: ChunkKind,
        *,
        seq: int,
        ts_unix_ms: int,
        payload: Any = None,
        provider_event: str | None = None,
        run_id: str | None = None,
        prev_sha256: str | None = None,
    ) -> bytes:
        """The bytes `encode_chunk` prints for the chunk these facts make (`make_chunk`
        with this framer's Action and endpoint)."""
        operator = self.operator
        if (
            not self._spliced
            or type(seq) is not int
            or type(ts_unix_ms) is not int
            or not 0 <= seq <= _I64_MAX
            or not 0 <= ts_unix_ms <= _I64_MAX
            or (prev_sha256 is not None and type(prev_sha256) is not str)
            or (run_id is not None and type(run_id) is not str)
            or (provider_event is not None and type(provider_event) is not str)
            or not is_plain(payload)
        ):
            chunk = make_chunk(
                kind, action_id=self.action_id, endpoint_id=self.endpoint_id, seq=seq,
                ts_unix_ms=ts_unix_ms, payload=payload, provider_event=provider_event,
                run_id=run_id, prev_sha256=prev_sha256,
            )  # fmt: skip
            return encode_chunk(chunk, operator=operator)
        if ts_unix_ms != self._ms:  # first, as `encode_chunk` refuses a time past 9999 first
            self._ms_sent_at = plain_bytes(timestamp_of_ms(ts_unix_ms))
            self._ms_id = (ts_unix_ms & _MS_MASK).to_bytes(6, "big").hex()
            self._ms = ts_unix_ms
        try:
            parts = self._members(kind._value_, seq, payload, provider_event, run_id, prev_sha256)
        except UnicodeEncodeError:  # as `plain_bytes` says it
            raise NotCanonicalizable(_SURROGATE) from None
        place = self._id_hash.copy()
        place.update(f"{seq}:{prev_sha256 or ''}:{kind._value_}".encode())
        digest = place.digest()
        # The UUIDv7 layout of `chunk_message_id`: version 7 in the high nibble of byte 6
        # (the hash's first byte), variant 10 in the top bits of byte 8 (its third).
        layout = bytes((0x70 | digest[0] & 0x0F, digest[1], 0x80 | digest[2] & 0x3F))
        parts += (
            b',"ts_unix_ms":', b"%d" % ts_unix_ms, self._from_head,
            (self._ms_id + layout.hex() + digest[3:10].hex()).encode(),
            _TYPE_AND_SENT_AT, self._ms_sent_at,
            b"}",
        )
        return b"".join(parts)

    def _members(
        self,
        value: str,
        seq: int,
        payload: Any,
        provider_event: str | None,
        run_id: str | None,
        prev_sha256: str | None,
    ) -> list[bytes]:
        """A chunk's own members up to its `ts_unix_ms`, printed in canonical order by the
        sorted encoder (UnicodeEncodeError for a lone surrogate), between the shared parts.
        The run id and provider event of the chunk before are kept printed: a run's chunks
        repeat them."""
        parts = [self._data_head]
        # `data`: one key, the form (`_data`); its members in sorted order.
        if self.operator:
            parts += (b'{"hermes_operator":', _print(payload), b"}")
        elif provider_event is not None:
            if payload is None:
                parts += (b'{"hermes_sse":{"event":', self._event_json(provider_event), b"}}")
            else:
                parts += (b'{"hermes_sse":{"data":', _print(payload),
                          b',"event":', self._event_json(provider_event), b"}}")
        else:
            parts += (b'{"hermes_worker":', _print(payload), b"}")
        parts += (b',"kind":"', value.encode(), b'"')
        if value == "data" and type(payload) is dict:
            delta = payload.get("delta")
            if type(delta) is str and delta:
                parts += (b',"part":{"text":', _print(delta), b',"type":"text"}')
        parts += (b',"sequence":', b"%d" % seq, self._extension_head)
        if prev_sha256 is not None:
            parts += (b',"prev_sha256":', _print(prev_sha256))
        if self.operator and provider_event is not None:
            parts += (b',"provider_event":', self._event_json(provider_event))
        if run_id is not None:
            if run_id != self._run_id:
                self._run_id_json = _print(run_id)
                self._run_id = run_id
            parts += (b',"run_id":', self._run_id_json)
        return parts

    def _event_json(self, provider_event: str) -> bytes:
        if provider_event != self._event:
            self._event_printed = _print(provider_event)
            self._event = provider_event
        return self._event_printed

    def encode(self, chunk: StreamChunk) -> bytes:
        """The bytes of one of this Action's chunks (a re-send, the head's record): the
        same as when it was first framed."""
        if chunk.action_id != self.action_id or chunk.endpoint_id != self.endpoint_id:
            return encode_chunk(chunk, operator=self.operator)
        return self.frame(
            chunk.kind,
            seq=chunk.seq,
            ts_unix_ms=chunk.ts_unix_ms,
            payload=chunk.payload,
            provider_event=chunk.provider_event,
            run_id=chunk.run_id,
            prev_sha256=chunk.prev_sha256,
        )


_I64_MAX: Final = 2**63 - 1
_SURROGATE: Final = "a string holds a lone surrogate (not valid Unicode)"
#: The sorted encoder `plain_bytes` prints with, without its wrapper: `ChunkFramer` turns a
#: lone surrogate's UnicodeEncodeError into NotCanonicalizable once per chunk.
_print: Final = PLAIN_ENCODER.encode
_TYPE_AND_SENT_AT: Final = b'","message_type":' + plain_bytes(CHUNK_TYPE) + b',"sent_at":'


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
    "ChunkFramer",
    "chunk_message_id",
    "decode_chunk",
    "encode_chunk",
]


def aip_chunk_of(data: bytes) -> AipStreamChunk:
    """The AIP StreamChunk (`body.stream_chunk`) of chunk Envelope bytes already opened
    (`decode_chunk`), as AIP 1.0's own type (`schemas/aip/stream.py`): `sequence`, `kind`,
    `data` in upstream's forms and the text `part`, none of our extension's facts."""
    body = open_body(CHUNK_TYPE, canonical.loads(data)["body"])
    assert isinstance(body, AipStreamChunk)
    return body
