"""Server-sent-event framing shared by the streaming routes.

SSE responses are prepared (headers sent) inside the handler, before the security-header
middleware could touch them, which is why real Hermes streams carry none of those headers;
the fake gets the same result the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web

from worker.testing.fake_hermes.envelopes import dumps

T = TypeVar("T")

KEEPALIVE = b": keepalive\n\n"
STREAM_CLOSED = b": stream closed\n\n"
DONE = b"data: [DONE]\n\n"


async def open_stream(
    request: web.Request, headers: Mapping[str, str] | None = None
) -> web.StreamResponse:
    """Send the 200 and the SSE header set; the body follows frame by frame."""
    response = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            **(headers or {}),
        },
    )
    response.enable_chunked_encoding()
    await response.prepare(request)
    return response


def data_frame(payload: object) -> bytes:
    """An unnamed frame: one `data:` line of JSON."""
    return b"data: " + dumps(payload).encode() + b"\n\n"


def named_frame(event: str, payload: object) -> bytes:
    """A named frame: `event:` then one `data:` line of JSON."""
    return f"event: {event}\n".encode() + data_frame(payload)


class Idle:
    """Marker yielded by `paced` when nothing arrived within the timeout."""


IDLE = Idle()


@dataclass(frozen=True, slots=True)
class _End:
    error: Exception | None


async def paced(source: AsyncIterator[T], idle_s: float) -> AsyncIterator[T | Idle]:
    """Re-yield `source`, inserting `IDLE` after every `idle_s` seconds without an item.

    The source runs in its own task (so a timeout never cancels it half-way); leaving the
    loop early cancels that task, which is how a disconnecting client interrupts the agent.
    """
    queue: asyncio.Queue[T | _End] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in source:
                queue.put_nowait(item)
        except Exception as exc:  # handed to the consumer, which re-raises it
            queue.put_nowait(_End(exc))
            return
        queue.put_nowait(_End(None))

    task = asyncio.create_task(pump())
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), idle_s)
            except TimeoutError:
                yield IDLE
                continue
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        task.cancel()
