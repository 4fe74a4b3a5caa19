"""Fixtures of the trust tests: one real Redis per session, fresh trust files per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from worker.settings import Settings
from worker.testing.identities import TrustFiles, write_trust_files
from worker.testing.redis_server import RedisServer
from worker.trust.gate import TrustGate


@pytest.fixture(scope="session")
def trust_redis_server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=False) as server:
        yield server


@pytest_asyncio.fixture
async def redis(trust_redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(trust_redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def trust_files(tmp_path: Path) -> TrustFiles:
    return write_trust_files(tmp_path)


@pytest.fixture
def settings(trust_files: TrustFiles) -> Settings:
    return Settings(**trust_files.settings_overrides())


@pytest.fixture
def gate(settings: Settings) -> TrustGate:
    return TrustGate.from_settings(settings)
