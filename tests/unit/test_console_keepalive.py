"""A followed run's event stream says it is alive while the run is silent, and a reader that
goes away stops the follower behind it (worker/console/app.py `with_keepalive`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from worker.console.app import with_keepalive


async def _slow(closed: list[bool], pause_s: float) -> AsyncIterator[str]:
    try:
        yield "event: chunk\ndata: 1\n\n"
        await asyncio.sleep(pause_s)
        yield "event: end\ndata: ended\n\n"
    finally:
        closed.append(True)


async def test_silence_is_filled_with_comments_and_every_event_arrives_in_order() -> None:
    closed: list[bool] = []
    got = [event async for event in with_keepalive(_slow(closed, 0.35), 0.1)]
    assert got[0] == "event: chunk\ndata: 1\n\n"
    assert got[-1] == "event: end\ndata: ended\n\n"
    comments = got[1:-1]
    assert len(comments) >= 2
    assert all(c.startswith(":") for c in comments)
    assert closed == [True]


async def test_a_reader_that_leaves_stops_the_follower() -> None:
    closed: list[bool] = []
    stream = with_keepalive(_slow(closed, 3600), 0.05)
    assert await anext(stream) == "event: chunk\ndata: 1\n\n"
    assert (await anext(stream)).startswith(":")
    await stream.aclose()  # what the server does when the browser went away
    assert closed == [True]
