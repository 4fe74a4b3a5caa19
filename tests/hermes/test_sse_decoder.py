"""The bounded SSE decoder: Hermes' three frame shapes, every line ending, and its bounds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from worker.errors import SSEDecodeError, SSEError, SSEIdle, SSELimitReached
from worker.hermes.sse import RawEvent, SSEDecoder, SSELimits, aiter_events, parse_event

RUN_STREAM = (
    b'data: {"event": "message.delta", "run_id": "run_1", "delta": "Hel"}\n\n'
    b": keepalive\n\n"
    b'data: {"event": "run.completed", "run_id": "run_1", "output": "Hello"}\n\n'
    b": stream closed\n\n"
)


def decode_all(data: bytes, limits: SSELimits | None = None, step: int | None = None) -> list:
    decoder = SSEDecoder(limits)
    out = []
    pieces = [data] if step is None else [data[i : i + step] for i in range(0, len(data), step)]
    for piece in pieces:
        out.extend(decoder.feed(piece))
        if decoder.failure is not None:
            raise decoder.failure
    return out


def test_data_only_frames_are_named_by_their_json_event_field() -> None:
    events = [parse_event(raw) for raw in decode_all(RUN_STREAM)]
    assert [e.name for e in events] == ["message.delta", "run.completed"]
    assert events[1].data["output"] == "Hello"
    assert not events[0].named


def test_named_frames_take_the_event_line_as_their_name() -> None:
    data = b'event: response.completed\ndata: {"type": "response.completed", "x": 1}\n\n'
    (event,) = [parse_event(raw) for raw in decode_all(data)]
    assert (event.name, event.named, event.data["x"]) == ("response.completed", True, 1)


def test_done_marker_is_its_own_event_without_data() -> None:
    (event,) = [parse_event(raw) for raw in decode_all(b"data: [DONE]\n\n")]
    assert event.is_done_marker
    assert event.data is None


def test_comment_only_frames_dispatch_nothing() -> None:
    assert decode_all(b": keepalive\n\n: stream closed\n\n:\n\n") == []


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_frames_the_same_events(newline: bytes) -> None:
    data = RUN_STREAM.replace(b"\n", newline)
    assert decode_all(data) == decode_all(RUN_STREAM)


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64])
def test_split_points_do_not_change_the_events(step: int) -> None:
    data = RUN_STREAM.replace(b"\n", b"\r\n")
    assert decode_all(data, step=step) == decode_all(RUN_STREAM)


def test_multi_line_data_is_joined_with_newlines() -> None:
    (raw,) = decode_all(b'data: {"a":\ndata: 1}\n\n')
    assert raw.data == '{"a":\n1}'
    assert parse_event(raw).data == {"a": 1}


def test_frame_over_the_size_bound_is_a_decode_error() -> None:
    limits = SSELimits(max_frame_bytes=128)
    with pytest.raises(SSEDecodeError):
        decode_all(b"data: " + b"x" * 200 + b"\n\n", limits)


def test_a_line_without_end_cannot_grow_past_the_bound() -> None:
    decoder = SSEDecoder(SSELimits(max_frame_bytes=128))
    for _ in range(5):
        decoder.feed(b": never ending comment ")
    with pytest.raises(SSEDecodeError):
        decoder.feed(b": never ending comment ")


def test_a_frame_of_many_short_lines_counts_all_its_lines() -> None:
    with pytest.raises(SSEDecodeError):
        decode_all(b"data: x\n" * 40 + b"\n", SSELimits(max_frame_bytes=128))


def test_frame_exactly_at_the_bound_is_accepted() -> None:
    line = b'data: "' + b"x" * 119 + b'"'
    assert len(line) + 1 == 128
    (raw,) = decode_all(line + b"\n\n", SSELimits(max_frame_bytes=128))
    assert parse_event(raw).data == "x" * 119


def test_frames_before_a_broken_bound_are_still_delivered_in_order() -> None:
    decoder = SSEDecoder(SSELimits(max_events=2))
    data = b'data: {"event": "a"}\n\n' * 3
    assert [parse_event(raw).name for raw in decoder.feed(data)] == ["a", "a"]
    assert isinstance(decoder.failure, SSELimitReached)
    with pytest.raises(SSELimitReached):
        decoder.feed(b"data: 1\n\n")


def test_event_limit_stops_consumption() -> None:
    data = b'data: {"event": "message.delta"}\n\n' * 4
    assert len(decode_all(data, SSELimits(max_events=4))) == 4
    with pytest.raises(SSELimitReached):
        decode_all(data * 2, SSELimits(max_events=4))


def test_data_that_is_not_json_is_a_decode_error() -> None:
    (raw,) = decode_all(b'data: {"event": "message.delta", "delta": \n\n')
    with pytest.raises(SSEDecodeError):
        parse_event(raw)


def test_bytes_that_are_not_utf8_are_a_decode_error() -> None:
    with pytest.raises(SSEDecodeError):
        decode_all(b"data: \xff\xfe\n\n")


async def test_unterminated_last_frame_is_not_an_event() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'data: {"event": "message.delta"}\n\n'
        yield b'data: {"event": "run.completed"}\n'

    names = [event.name async for event in aiter_events(chunks())]
    assert names == ["message.delta"]


# --- bytes and time without an event ------------------------------------------------------

IDLE = SSELimits(max_idle_bytes=1024)


@pytest.mark.parametrize(
    "noise",
    [b"\n", b"\r\n", b": keepalive\n\n", b"event: x\n\n", b"id: 7\nretry: 5\n\n"],
    ids=["blank", "crlf", "comment", "named-without-data", "fields-without-data"],
)
def test_endless_lines_without_an_event_end_at_the_idle_byte_bound(noise: bytes) -> None:
    with pytest.raises(SSEIdle, match="1024 bytes without an event"):
        decode_all(noise * 2048, IDLE, step=100)


def test_noise_up_to_the_bound_passes_and_an_event_resets_it() -> None:
    noise = b": keepalive\n\n" * 70  # 910 bytes: under the bound
    event = b'data: {"event": "message.delta"}\n\n'
    events = decode_all((noise + event) * 10, IDLE)
    assert len(events) == 10


def test_a_stream_that_sends_no_event_for_too_long_ends_at_the_idle_time_bound() -> None:
    now = [0.0]
    decoder = SSEDecoder(SSELimits(max_idle_s=30.0), clock=lambda: now[0])
    assert decoder.feed(b'data: {"event": "message.delta"}\n\n')
    now[0] = 29.0
    assert decoder.feed(b": keepalive\n\n") == []
    now[0] = 31.0
    with pytest.raises(SSEIdle, match="no event for 30 s"):
        decoder.feed(b": keepalive\n\n")


def test_an_event_restarts_the_idle_clock() -> None:
    now = [0.0]
    decoder = SSEDecoder(SSELimits(max_idle_s=30.0), clock=lambda: now[0])
    for step in range(1, 10):
        now[0] = step * 20.0
        assert decoder.feed(b': keepalive\n\ndata: {"event": "message.delta"}\n\n')


async def test_the_decoder_gives_the_loop_a_turn_after_every_chunk() -> None:
    """A source whose chunks never suspend (a full socket buffer) must not hold the loop."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def buffered() -> AsyncIterator[bytes]:
        for _ in range(50):
            yield b": keepalive\n\n" * 10  # never awaits anything

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        assert [e async for e in aiter_events(buffered())] == []
    finally:
        task.cancel()
    assert ticks >= 50


# --- properties -----------------------------------------------------------------------------

FRAME_LIMIT = 256
EVENT_LIMIT = 8
LIMITS = SSELimits(max_frame_bytes=FRAME_LIMIT, max_events=EVENT_LIMIT)

_line = st.one_of(
    st.builds(
        lambda v: b"data: " + json.dumps(v).encode(),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    ),
    st.just(b"data: [DONE]"),
    st.builds(lambda s: b"event: " + s.encode(), st.text(alphabet="abc.", max_size=12)),
    st.just(b": keepalive"),
    st.just(b""),
    st.binary(max_size=40),
)
_stream = st.lists(st.tuples(_line, st.sampled_from([b"\n", b"\r\n", b"\r"])), max_size=40).map(
    lambda parts: b"".join(line + end for line, end in parts)
)


def _mutate(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    mutated = bytearray(data)
    for index, value in flips:
        if mutated:
            mutated[index % len(mutated)] = value
    return bytes(mutated)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=_stream,
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    step=st.integers(1, 50),
)
def test_decoder_never_crashes_and_never_exceeds_its_bounds(
    data: bytes, flips: list[tuple[int, int]], step: int
) -> None:
    data = _mutate(data, flips)
    decoder = SSEDecoder(LIMITS)
    delivered = 0
    try:
        for i in range(0, len(data), step):
            for raw in decoder.feed(data[i : i + step]):
                delivered += 1
                parse_event(raw)
            # What the decoder holds between feeds: the partial line and the frame's data.
            assert len(decoder._line) <= FRAME_LIMIT
            assert sum(len(part) for part in decoder._data) <= FRAME_LIMIT
    except SSEError:
        pass
    assert delivered <= EVENT_LIMIT


@settings(max_examples=300)
@given(data=st.binary(max_size=2_000), step=st.integers(1, 97))
def test_chunking_never_changes_what_is_decoded(data: bytes, step: int) -> None:
    def run(split: int | None) -> object:
        try:
            return decode_all(data, SSELimits(max_frame_bytes=4096, max_events=10_000), split)
        except SSEError as exc:
            return type(exc)

    assert run(step) == run(None)


class _LineByLine(SSEDecoder):
    one_step = False


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=_stream, flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                                    max_size=2), frame_limit=st.sampled_from([64, 100, 4096]),
       step=st.sampled_from([1, 7, 64, 999]))
@example(data=b"data: {}\n\n\r\n", flips=[], frame_limit=64, step=64)  # idle bytes after
@example(data=b"data: {}\n\n\n\n", flips=[], frame_limit=64, step=64)
@example(data=b"event: x\ndata:{}\n\n", flips=[], frame_limit=64, step=64)
@example(data=b"data: " + b"x" * 57 + b"\n\n", flips=[], frame_limit=64, step=999)  # at bound
@example(data=b"data: " + b"x" * 58 + b"\n\n", flips=[], frame_limit=64, step=999)  # past it
def test_the_one_step_data_frame_path_decodes_as_the_line_path(
    data: bytes, flips: list[tuple[int, int]], frame_limit: int, step: int
) -> None:
    """A `data:` line and its blank line found whole in one chunk are dispatched in one
    step; the line-by-line path decodes the same bytes, chunked alike, to the same events,
    the same failure, and the same frame, event and idle counts left behind."""
    data = _mutate(data, flips)
    limits = SSELimits(max_frame_bytes=frame_limit, max_events=EVENT_LIMIT, max_idle_bytes=200)

    def run(decoder: SSEDecoder) -> tuple[object, ...]:
        events: list[RawEvent] = []
        try:
            for i in range(0, len(data), step):
                events += decoder.feed(data[i : i + step])
                if decoder.failure is not None:
                    raise decoder.failure
        except SSEError as exc:
            return events, type(exc), decoder.events  # a failed decoder takes nothing more
        return (events, None, decoder.events, decoder._idle_bytes, decoder._frame_bytes,
                bytes(decoder._line), decoder._data, decoder._pending_cr)

    assert run(SSEDecoder(limits)) == run(_LineByLine(limits))
