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
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass
from typing import Any

import msgspec

DEFAULT_MAX_FRAME_BYTES = 1024 * 1024
DEFAULT_MAX_EVENTS = 4096
DONE_MARKER = "[DONE]"

_json = msgspec.json.Decoder()


class SSEError(Exception):
    """Base of the decoder's failures; messages never quote stream content."""


class SSEDecodeError(SSEError):
    """A frame over the size bound, or one that is not UTF-8 or not JSON."""


class SSELimitReached(SSEError):
    """The event-count bound ended consumption before the stream did."""


@dataclass(frozen=True, slots=True)
class SSELimits:
    """Bounds on one stream: bytes per frame (comments and blank lines included) and events."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_events: int = DEFAULT_MAX_EVENTS

    def __post_init__(self) -> None:
        if self.max_frame_bytes < 64 or self.max_events < 1:
            raise ValueError("SSE limits must allow at least a 64-byte frame and one event")


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

    def __init__(self, limits: SSELimits | None = None) -> None:
        self.limits = limits or SSELimits()
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
            return self._dispatch()
        self._frame_bytes += 1  # the line end counts towards the frame
        if self._frame_bytes > self.limits.max_frame_bytes:
            raise SSEDecodeError(f"an SSE frame exceeded {self.limits.max_frame_bytes} bytes")
        if line[0] == 0x3A:  # ':' comment, e.g. keepalive or "stream closed"
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
        elif field == "event":
            self._event = value
        elif field == "id" and "\x00" not in value:
            self._id = value
        # `retry:` and unknown fields are ignored, as the SSE standard says.
        return None

    def _dispatch(self) -> RawEvent | None:
        self._frame_bytes = 0
        if not self._has_data:
            self._event = None
            return None
        self.events += 1
        if self.events > self.limits.max_events:
            raise SSELimitReached(f"the stream passed the {self.limits.max_events}-event limit")
        event = RawEvent(event=self._event or None, data="\n".join(self._data), id=self._id)
        self._event = None
        self._data = []
        self._has_data = False
        return event


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
    """
    decoder = SSEDecoder(limits)
    async for chunk in chunks:
        for raw in decoder.feed(chunk):
            yield parse_event(raw)
        if decoder.failure is not None:
            raise decoder.failure
