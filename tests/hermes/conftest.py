"""Fixtures of the client tests: a scripted server, a second origin, both transports."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from scripted_server import ScriptedServer, make_client

from worker.hermes.http_client import HermesClient, Transport


@pytest_asyncio.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    scripted = ScriptedServer()
    await scripted.start()
    try:
        yield scripted
    finally:
        await scripted.stop()


@pytest_asyncio.fixture
async def other_origin() -> AsyncIterator[ScriptedServer]:
    """A second origin a redirect may point at; it must never see a request."""
    scripted = ScriptedServer()
    await scripted.start()
    try:
        yield scripted
    finally:
        await scripted.stop()


@pytest.fixture(params=["h1", "aiohttp", "httpx"])
def transport(request: pytest.FixtureRequest) -> Transport:
    value: Transport = request.param
    return value


@pytest_asyncio.fixture
async def client(server: ScriptedServer, transport: Transport) -> AsyncIterator[HermesClient]:
    hermes = make_client(server.url, transport)
    try:
        yield hermes
    finally:
        await hermes.aclose()
