"""A bounded server-sent-events decoder for Hermes streams.

Hand-written rather than httpx-sse: httpx-sse reads lines through httpx's line decoder,
which buffers a line of any length, so a server that never sends a newline could make the
worker hold an unbounded buffer; and it has no event-count limit. This decoder enforces
both bounds on the bytes as they arrive, so memory per stream is at most one frame.

It follows the WHATWG framing (LF, CRLF or CR line ends; `:` comments; `event:`, `data:`,
`id:` fields; a blank line dispatches) and handles the three shapes Hermes 0.19 sends:

* `data:`-only frames whose JSON names the event (`{"event": "run.completed", ...}`,
  the run event stream);
* named frames, `event: response.completed` then `data: {...}` (responses, session chat);
* `data: [DONE]`, the chat-completions end marker.

Comments (`: keepalive`, `: stream closed`) are skipped; they carry no state.

A stream that sends bytes but no event (endless blank lines, endless comments, `event:` or
`id:` lines never followed by data) is bounded too: by the bytes received since the last
event (`max_idle_bytes`) and by the time since it (`max_idle_s`, checked whenever such a
line arrives; a stream silent on the socket is the read timeout's). And `aiter_events`
gives the event loop a turn after every network chunk: a server that keeps the socket
buffer full would otherwise never let another task of the worker run.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncGenerator, AsyncIterable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec

from worker.errors import SSEDecodeError, SSEError, SSEIdle, SSELimitReached

DEFAULT_MAX_FRAME_BYTES = 1024 * 1024
DEFAULT_MAX_EVENTS = 4096
#: Bytes a stream may send between two events: Hermes' keepalive (`: keepalive` and a blank
#: line, 13 bytes every 30 s) needs 64 KiB only after ~40 hours without an event.
DEFAULT_MAX_IDLE_BYTES = 64 * 1024
#: Time a stream may keep sending bytes without an event (long tool calls send keepalives
#: only; the Action deadline still bounds the whole stream).
DEFAULT_MAX_IDLE_S = 300.0
#: The most bytes decoded between two turns of the event loop (see `aiter_events`).
FEED_SLICE_BYTES = 16 * 1024
DONE_MARKER = "[DONE]"

_json = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class SSELimits:
    """Bounds on one stream: bytes per frame (comments and blank lines included), events,
    and bytes and seconds without an event."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_events: int = DEFAULT_MAX_EVENTS
    max_idle_bytes: int = DEFAULT_MAX_IDLE_BYTES
    max_idle_s: float = DEFAULT_MAX_IDLE_S

    def __post_init__(self) -> None:
        if self.max_frame_bytes < 64 or self.max_events < 1:
            raise ValueError("SSE limits must allow at least a 64-byte frame and one event")
        if self.max_idle_bytes < 64 or self.max_idle_s <= 0:
            raise ValueError("SSE limits must allow 64 bytes and some time without an event")


@dataclass(frozen=True, slots=True)
class RawEvent:
    """One dispatched frame before JSON parsing."""

    event: str | None
    data: str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One parsed Hermes event.

    `name` is the `event:` line when there is one, else the JSON's `event` field (runs) or
    `type` field, else `"message"`; the `[DONE]` marker has name `"[DONE]"` and no data.
    """

    name: str
    data: Any
    named: bool

    @property
    def is_done_marker(self) -> bool:
        return self.name == DONE_MARKER


class SSEDecoder:
    """Incremental framing: feed bytes, get complete frames; never buffers more than a frame."""

    #: A `data:` line and its blank line found whole in one chunk are dispatched in one
    #: step (a relayed run sends one such frame per event); False decodes every frame line
    #: by line (the reference the one-step path is tested against).
    one_step: ClassVar[bool] = True

    def __init__(
        self, limits: SSELimits | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits or SSELimits()
        self._clock = clock
        #: Bytes of lines that were not `data:` lines since the last event was dispatched.
        self._idle_bytes = 0
        self._last_event_at = clock()
        self._line = bytearray()
        #: Bytes of the frame being assembled (completed lines plus the partial one).
        self._frame_bytes = 0
        self._pending_cr = False
        self._event: str | None = None
        self._data: list[str] = []
        self._has_data = False
        self._id: str | None = None
        self.events = 0
        #: The bound that broke, once one did; the decoder accepts nothing after it.
        self.failure: SSEError | None = None

    def feed(self, chunk: bytes) -> list[RawEvent]:
        """Consume `chunk` and return the frames it completed.

        When a bound breaks inside `chunk`, the frames completed before it are still
        returned (they were valid and in order) and the failure is kept in `failure`;
        the caller raises it after handing those frames on, and any later `feed` raises it.
        """
        if self.failure is not None:
            raise self.failure
        out: list[RawEvent] = []
        try:
            self._feed(chunk, out)
        except SSEError as exc:
            self.failure = exc
            if not out:
                raise
        return out

    def _feed(self, chunk: bytes, out: list[RawEvent]) -> None:
        start = 0
        size = len(chunk)
        if size and self._pending_cr:
            self._pending_cr = False
            if chunk[0] == 0x0A:
                start = 1  # the LF of a CRLF split across chunks
        while start < size:
            if (
                self.one_step
                and not self._line
                and not self._has_data
                and chunk.startswith(b"data:", start)
            ):
                # The frame Hermes sends per event, `data: {...}` and one blank line, LF
                # only: dispatched here in one step. The same fields, bounds and counts as
                # the line-by-line path below, which takes every other shape.
                lf = chunk.find(b"\n", start)
                if (
                    lf >= 0
                    and chunk.startswith(b"\n", lf + 1)
                    # no CR in the line, its end, or a CRLF right after (idle bytes
                    # would be counted apart from the blank line's run)
                    and chunk.find(b"\r", start, lf + 3) < 0
                    and lf - start + 1 <= self.limits.max_frame_bytes - self._frame_bytes
                ):
                    skip = 6 if chunk.startswith(b" ", start + 5) else 5  # one leading space
                    value = chunk[start + skip : lf]
                    try:
                        text = value.decode("utf-8")
                    except UnicodeDecodeError:
                        raise SSEDecodeError("an SSE line is not UTF-8") from None
                    self._data.append(text)
                    self._has_data = True
                    out.append(self._dispatch())  # type: ignore[arg-type]  # has data
                    start = lf + 2
                    continue
            if not self._line and chunk[start] in _LINE_END_BYTES:
                # Blank lines, possibly very many: the first may dispatch a frame, the
                # rest are idle bytes, counted at once rather than line by line.
                run = _LINE_ENDS.match(chunk, start)
                assert run is not None
                end = run.end()
                first = 2 if chunk.startswith(b"\r\n", start) else 1
                event = self._line_done(b"")
                if event is not None:
                    out.append(event)
                if end - start > first:
                    self._idle(end - start - first)
                start = end
                if chunk[end - 1] == 0x0D and end == size:
                    self._pending_cr = True
                continue
            cut = _next_line_end(chunk, start)
            if cut < 0:
                self._grow(chunk[start:])
                break
            self._grow(chunk[start:cut])
            if chunk[cut] == 0x0D:
                if cut + 1 < size:
                    start = cut + 2 if chunk[cut + 1] == 0x0A else cut + 1
                else:
                    self._pending_cr = True
                    start = size
            else:
                start = cut + 1
            line = bytes(self._line)
            self._line.clear()
            event = self._line_done(line)
            if event is not None:
                out.append(event)

    def _grow(self, piece: bytes) -> None:
        if not piece:
            return
        self._frame_bytes += len(piece)
        if self._frame_bytes > self.limits.max_frame_bytes:
            raise SSEDecodeError(f"an SSE frame exceeded {self.limits.max_frame_bytes} bytes")
        self._line += piece

    def _line_done(self, line: bytes) -> RawEvent | None:
        if not line:
            event = self._dispatch()
            if event is None:
                self._idle(1)
            return event
        self._frame_bytes += 1  # the line end counts towards the frame
        if self._frame_bytes > self.limits.max_frame_bytes:
            raise SSEDecodeError(f"an SSE frame exceeded {self.limits.max_frame_bytes} bytes")
        if line[0] == 0x3A:  # ':' comment, e.g. keepalive or "stream closed"
            self._idle(len(line) + 1)
            return None
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise SSEDecodeError("an SSE line is not UTF-8") from None
        field, sep, value = text.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._has_data = True
            return None
        if field == "event":
            self._event = value
        elif field == "id" and "\x00" not in value:
            self._id = value
        # `retry:` and unknown fields are ignored, as the SSE standard says.
        self._idle(len(line) + 1)
        return None

    def _idle(self, size: int) -> None:
        """Count `size` bytes that brought no event closer; past a bound the stream ends."""
        self._idle_bytes += size
        if self._idle_bytes > self.limits.max_idle_bytes:
            raise SSEIdle(
                f"the stream sent over {self.limits.max_idle_bytes} bytes without an event"
            )
        if self._clock() - self._last_event_at > self.limits.max_idle_s:
            raise SSEIdle(f"the stream sent no event for {self.limits.max_idle_s:g} s")

    def _dispatch(self) -> RawEvent | None:
        self._frame_bytes = 0
        if not self._has_data:
            self._event = None
            return None
        self.events += 1
        self._idle_bytes = 0
        self._last_event_at = self._clock()
        if self.events > self.limits.max_events:
            raise SSELimitReached(f"the stream passed the {self.limits.max_events}-event limit")
        event = RawEvent(event=self._event or None, data="\n".join(self._data), id=self._id)
        self._event = None
        self._data = []
        self._has_data = False
        return event


_LINE_END_BYTES = (0x0A, 0x0D)
_LINE_ENDS = re.compile(rb"[\r\n]+")


def _next_line_end(chunk: bytes, start: int) -> int:
    lf = chunk.find(b"\n", start)
    cr = chunk.find(b"\r", start, lf if lf >= 0 else len(chunk))
    return cr if cr >= 0 else lf


def parse_event(raw: RawEvent) -> SSEEvent:
    """JSON-decode one frame and name it; non-JSON data (other than `[DONE]`) is a decode error."""
    if raw.data == DONE_MARKER:
        return SSEEvent(name=DONE_MARKER, data=None, named=raw.event is not None)
    try:
        data = _json.decode(raw.data)
    except msgspec.DecodeError:
        raise SSEDecodeError("an SSE frame's data is not JSON") from None
    if raw.event is not None:
        return SSEEvent(name=raw.event, data=data, named=True)
    name = "message"
    if isinstance(data, dict):
        for key in ("event", "type"):
            value = data.get(key)
            if isinstance(value, str) and value:
                name = value
                break
    return SSEEvent(name=name, data=data, named=False)


async def aiter_events(
    chunks: AsyncIterable[bytes], limits: SSELimits | None = None
) -> AsyncGenerator[SSEEvent, None]:
    """Parsed events of a byte stream, bounded by `limits`.

    A partial frame left when the bytes end is dropped: an unterminated frame was never
    dispatched, so treating it as an event would invent one the server did not finish.

    After each network chunk, and every `FEED_SLICE_BYTES` of a larger one, the event loop
    gets a turn (`sleep(0)`): reading a chunk that is already buffered does not suspend, so
    a server that keeps the buffer full would otherwise hold the loop until a bound ends
    its stream, and one chunk of short lines costs milliseconds of Python per 16 KiB.

    The frame keeps neither the last chunk nor the last frame while it waits for more
    bytes: a held run's stream waits there for most of its life.
    """
    decoder = SSEDecoder(limits)
    async for chunk in chunks:
        for at in range(0, len(chunk), FEED_SLICE_BYTES):
            frames = decoder.feed(chunk[at : at + FEED_SLICE_BYTES])
            frames.reverse()
            while frames:
                yield parse_event(frames.pop())
            if decoder.failure is not None:
                raise decoder.failure
            await asyncio.sleep(0)
        # Not kept while the next bytes are awaited: a held run waits there for seconds,
        # and 10,000 of them would each keep their last network chunk (bench figure 4).
        del chunk
