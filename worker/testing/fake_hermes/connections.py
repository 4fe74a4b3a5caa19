"""Open long-lived requests, so faults and a simulated restart can cut them like a dying process.

Hanging requests (`hold`) wait here until the client gives up, the server restarts or stops;
`drop` closes a connection without a reply. Both hand aiohttp a response object that will
never be written, because the transport is already gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from aiohttp import web


class Connections:
    """The streaming and hanging requests currently open."""

    def __init__(self) -> None:
        # Keyed by id(): aiohttp requests are not hashable.
        self._open: dict[int, web.Request] = {}
        self._release = asyncio.Event()

    def __len__(self) -> int:
        """How many tracked requests are still open (a test sees a writer has stopped)."""
        return len(self._open)

    @contextlib.contextmanager
    def track(self, request: web.Request) -> Iterator[None]:
        """Register a request for the duration of its handler."""
        self._open[id(request)] = request
        try:
            yield
        finally:
            self._open.pop(id(request), None)

    async def hold(self, request: web.Request) -> web.StreamResponse:
        """Never answer: wait until the connection is cut (restart, stop, or client gone)."""
        with self.track(request):
            await self._release.wait()
        return self.drop(request)

    def drop(self, request: web.Request) -> web.StreamResponse:
        """Close the connection with no (further) bytes: the client sees a disconnect."""
        transport = request.transport
        if transport is not None:
            transport.abort()
        return web.StreamResponse()

    def cut_all(self) -> None:
        """Abort every tracked connection and release every held request."""
        for request in list(self._open.values()):
            self.drop(request)
        self._open.clear()
        self._release.set()
        self._release = asyncio.Event()
