"""A scripted HTTP server: each test says exactly which status, headers and bytes it answers.

The fake Hermes is faithful to what 0.19.0 does; these tests need what it never does on its
own (every status code, a redirect to a second origin, a frame split at any byte, a stream
that ends mid-frame), so they get a server that answers whatever it is told to.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from worker.endpoints import Endpoint, EndpointDescriptor
from worker.hermes.http_client import HermesClient, Transport
from worker.secret_files import Secret

API_KEY = "sk-test-SECRET-0123456789abcdef-MUST-NOT-LEAK"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    #: Sent in this many writes (a list), or at once.
    body: bytes | list[bytes] = b"{}"
    #: Seconds to wait before each write.
    delay_s: float = 0.0
    #: Seconds to keep the connection open after the last write.
    linger_s: float = 0.0


@dataclass
class Seen:
    method: str
    path: str
    #: Case-insensitive, as HTTP header names are.
    headers: CIMultiDict[str]
    body: bytes


class ScriptedServer:
    def __init__(self) -> None:
        self.replies: dict[str, Reply] = {}
        self.seen: list[Seen] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    def script(self, path: str, reply: Reply) -> None:
        self.replies[path] = reply

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(
            Seen(request.method, request.raw_path, request.headers.copy(), await request.read())
        )
        reply = self.replies.get(request.raw_path, Reply(status=404, body=b"404: Not Found"))
        response = web.StreamResponse(status=reply.status, headers=reply.headers)
        pieces = reply.body if isinstance(reply.body, list) else [reply.body]
        if isinstance(reply.body, list):
            response.enable_chunked_encoding()
        else:
            response.content_length = len(reply.body)
        await response.prepare(request)
        for piece in pieces:
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            await response.write(piece)
        if reply.linger_s:
            await asyncio.sleep(reply.linger_s)
        await response.write_eof()
        return response

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def make_client(
    url: str, transport: Transport, *, key: str | None = API_KEY, **desc: Any
) -> HermesClient:
    endpoint = Endpoint(
        descriptor=EndpointDescriptor(id="hermes-1", url=url, **desc),
        api_key=None if key is None else Secret(key),
    )
    return HermesClient(endpoint, transport=transport)


def sse(*frames: str) -> bytes:
    return "".join(frames).encode()
