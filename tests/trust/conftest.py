"""Fixtures of the trust tests: the plugin's Redis (empty for each test), fresh trust files."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from worker.settings import Settings
from worker.testing.identities import TrustFiles, write_trust_files
from worker.testing.services import ServiceHandle
from worker.trust.gate import TrustGate


@pytest_asyncio.fixture
async def redis(redis_server: ServiceHandle) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url)
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
