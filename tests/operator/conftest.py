"""Fixtures of the operator tests: a real redis-server and the project's fake Hermes.

Redis is the plugin's `redis_server` (AOF `always`, as in production; empty when each test
starts); each test gets its own fake Hermes with short timers, its own HTTP client and its
own Redis connection, so nothing leaks between tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from operator_support import Harness, endpoint_for, fake_config
from redis.asyncio import Redis

from worker.hermes.feature_probe import refresh_features
from worker.hermes.http_client import HermesClient
from worker.operator.policy import HermesOperatorPolicy
from worker.testing.fake_hermes import FakeConfig, FakeHermes
from worker.testing.services import ServiceHandle


@pytest_asyncio.fixture
async def redis(redis_server: ServiceHandle) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def fake_settings() -> FakeConfig:
    """Override in a module (or parametrize) to change the fake's timers."""
    return fake_config()


@pytest_asyncio.fixture
async def fake(fake_settings: FakeConfig) -> AsyncIterator[FakeHermes]:
    async with FakeHermes(config=fake_settings) as server:
        yield server


@pytest_asyncio.fixture
async def hermes(fake: FakeHermes) -> AsyncIterator[HermesClient]:
    client = HermesClient(endpoint_for(fake.url, fake.api_key))
    # What a worker's serving probe does at start: learn what this Hermes advertises
    # beyond 0.19 (nothing, unless the fake runs with its post-0.19 flags).
    await refresh_features(client)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def policy() -> HermesOperatorPolicy:
    """Spec defaults, with a fast poll so recovery tests take milliseconds."""
    return HermesOperatorPolicy(poll_interval_ms=20, cancel_grace_ms=3_000)


@pytest.fixture
def harness(redis: Redis, hermes: HermesClient, policy: HermesOperatorPolicy) -> Harness:
    return Harness(redis, hermes, policy)
