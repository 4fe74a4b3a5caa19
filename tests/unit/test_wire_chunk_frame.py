"""A chunk's Envelope framed by `encode_chunk` itself is byte for byte the one `seal` frames.

`worker.wire.chunks.encode_chunk` builds its frame without `seal` (a chunk per provider
event; `seal`'s general checks and copies were most of a chunk's framing CPU). These tests
hold the two to the same bytes over generated chunks, payloads that are not plain JSON
included, and the chunk's message id to the UUIDv7 layout written out in integer
arithmetic, as it was first written.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from worker.aip.canonical import loads
from worker.aip.errors import NotCanonicalizable
from worker.wire.actions import timestamp_of_ms
from worker.wire.chunks import (
    CHUNK_TYPE,
    ChunkFramer,
    chunk_body,
    chunk_message_id,
    decode_chunk,
    encode_chunk,
)
from worker.wire.envelopes import seal
from worker.wire.results import worker_principal


def sealed(chunk: StreamChunk, *, operator: bool) -> bytes:
    """The chunk's Envelope as `seal` frames it (checked, canonicalised by the full walk)."""
    extension: dict[str, Any] = {"endpoint_id": chunk.endpoint_id, "ts_unix_ms": chunk.ts_unix_ms}
    if chunk.prev_sha256 is not None:
        extension["prev_sha256"] = chunk.prev_sha256
    if chunk.run_id is not None:
        extension["run_id"] = chunk.run_id
    if operator and chunk.provider_event is not None:
        extension["provider_event"] = chunk.provider_event
    return seal(
        CHUNK_TYPE,
        chunk_body(chunk, operator=operator),
        sender=worker_principal(chunk.endpoint_id),
        signer=None,
        extension=extension,
        message_id=reference_message_id(chunk),
        sent_at=timestamp_of_ms(chunk.ts_unix_ms),
    )


def reference_message_id(chunk: StreamChunk) -> str:
    place = f"{chunk.action_id}:{chunk.seq}:{chunk.prev_sha256 or ''}:{chunk.kind.value}"
    rand = int.from_bytes(hashlib.sha256(place.encode()).digest()[:10], "big")
    value = (chunk.ts_unix_ms & (2**48 - 1)) << 80 | rand
    value = (value & ~(0xF << 76)) | (0x7 << 76)
    value = (value & ~(0x3 << 62)) | (0x2 << 62)
    return f"msg_{value:032x}"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=12,
)
payloads = (
    json_values
    | st.fixed_dictionaries({"delta": st.text(max_size=8)}, optional={"x": json_values})
    | st.tuples(st.integers(), st.floats(allow_nan=False, allow_infinity=False))  # not plain
)


@st.composite
def chunks(draw: st.DrawFn) -> StreamChunk:
    return make_chunk(
        draw(st.sampled_from(list(ChunkKind))),
        action_id="act_" + draw(st.text("0123456789abcdef", min_size=32, max_size=32)),
        endpoint_id=draw(st.sampled_from(["h1", "edge-2", "a_b"])),
        seq=draw(st.integers(min_value=0, max_value=2**40)),
        ts_unix_ms=draw(st.integers(min_value=0, max_value=253_402_300_799_999)),
        payload=draw(payloads),
        provider_event=draw(st.none() | st.sampled_from(["message.delta", "run.completed"])),
        run_id=draw(st.none() | st.just("run_1")),
        prev_sha256=draw(st.none() | st.just("ab" * 32)),
    )


@settings(max_examples=400)
@given(chunks(), st.booleans())
def test_encode_chunk_prints_what_seal_prints(chunk: StreamChunk, operator: bool) -> None:
    data = encode_chunk(chunk, operator=operator)
    assert data == sealed(chunk, operator=operator)
    assert decode_chunk(data)[0].seq == chunk.seq


@settings(max_examples=300)
@given(chunks())
def test_message_id_keeps_the_uuidv7_layout(chunk: StreamChunk) -> None:
    assert chunk_message_id(chunk) == reference_message_id(chunk)
    assert loads(encode_chunk(chunk))["message_id"] == reference_message_id(chunk)


def test_a_payload_without_canonical_form_is_refused_as_seal_refuses_it() -> None:
    chunk = make_chunk(
        ChunkKind.DATA,
        action_id="act_" + "0" * 32,
        endpoint_id="h1",
        seq=0,
        ts_unix_ms=1,
        payload={"delta": "\ud800"},
    )
    with pytest.raises(NotCanonicalizable):
        sealed(chunk, operator=False)
    with pytest.raises(NotCanonicalizable):
        encode_chunk(chunk)


def framed(chunk: StreamChunk, *, operator: bool) -> bytes:
    """The chunk as a `ChunkFramer` of its Action frames it (the chunk stream's path:
    `encode` hands a chunk of the framer's own Action to `frame`)."""
    return ChunkFramer(chunk.action_id, chunk.endpoint_id, operator=operator).encode(chunk)


@settings(max_examples=500)
@given(chunks(), st.booleans())
def test_the_framer_prints_what_encode_chunk_prints(chunk: StreamChunk, operator: bool) -> None:
    try:
        expected = encode_chunk(chunk, operator=operator)
    except NotCanonicalizable:
        with pytest.raises(NotCanonicalizable):
            framed(chunk, operator=operator)
        return
    assert framed(chunk, operator=operator) == expected
    framer = ChunkFramer(chunk.action_id, chunk.endpoint_id, operator=operator)
    assert framer.encode(chunk) == expected


def test_one_framer_over_a_stream_keeps_each_chunks_own_bytes() -> None:
    """The framer's per-millisecond cache and hash prefix carry nothing from one chunk to
    the next: a stream of chunks in the same and in later milliseconds, of every kind and
    form, each framed as `encode_chunk` frames it alone; a chunk of another Action, a
    payload that is not plain JSON and an id that is not a str go through `encode_chunk`."""
    action_id = "act_" + "1" * 32
    for operator in (False, True):
        framer = ChunkFramer(action_id, "h1", operator=operator)
        prev: str | None = None
        for seq in range(60):
            chunk = make_chunk(
                list(ChunkKind)[seq % len(ChunkKind)],
                action_id=action_id,
                endpoint_id="h1",
                seq=seq,
                ts_unix_ms=1_796_565_774_000 + seq // 7,
                payload=[
                    {"delta": "é\n\"" * (seq % 3), "event": "message.delta", "t": seq / 7},
                    None,
                    {"n": 2**70},
                    (1, 2.5),
                    "text",
                ][seq % 5],
                provider_event=[None, "message.delta", "tool.started"][seq % 3],
                run_id=None if seq % 4 else "run_1",
                prev_sha256=prev,
            )
            data = encode_chunk(chunk, operator=operator)
            assert framer.encode(chunk) == data
            prev = hashlib.sha256(data).hexdigest()
        other = make_chunk(ChunkKind.DATA, action_id="act_" + "2" * 32, endpoint_id="h1",
                           seq=0, ts_unix_ms=1, payload={"delta": "x"})
        assert framer.encode(other) == encode_chunk(other, operator=operator)
    odd = ChunkFramer(action_id, "h1")
    assert odd.frame(ChunkKind.DATA, seq=1, ts_unix_ms=5, run_id=7) == encode_chunk(  # type: ignore[arg-type]
        make_chunk(ChunkKind.DATA, action_id=action_id, endpoint_id="h1", seq=1, ts_unix_ms=5,
                   run_id=7)  # type: ignore[arg-type]
    )
