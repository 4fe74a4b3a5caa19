"""A fake Hermes with short timers, and an authenticated client for it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio

from worker.testing.fake_hermes import FakeConfig, FakeHermes

API_KEY = "fake-hermes-test-key-0123456789"
#: Timers shortened so quirks that take seconds on the real server take milliseconds here.
FAST = FakeConfig(
    api_key=API_KEY,
    keepalive_s=0.2,
    approval_timeout_s=0.3,
    build_delay_s=0.01,
    missing_stream_delay_s=0.05,
    stop_latency_s=0.01,
)


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakeHermes]:
    async with FakeHermes(config=FAST) as server:
        yield server


@pytest_asyncio.fixture
async def client(fake: FakeHermes) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=fake.url, headers=headers, timeout=10.0) as http:
        yield http


async def start(client: httpx.AsyncClient, text: str | list[Any], **fields: Any) -> str:
    """POST /v1/runs and return the run id (asserting the 202)."""
    response = await client.post("/v1/runs", json={"input": text, **fields})
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    return run_id


async def sse_lines(client: httpx.AsyncClient, run_id: str) -> list[str]:
    """Every non-empty line of the run's event stream."""
    async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        assert response.status_code == 200
        return [line async for line in response.aiter_lines() if line]


def events_of(lines: list[str]) -> list[dict[str, Any]]:
    """The JSON payloads of `data:` lines."""
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
