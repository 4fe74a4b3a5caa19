"""Settings for the whole suite.

Property tests check what a function returns, not how fast: on a loaded machine (CI runs
the suite on four xdist processes over two cores) Hypothesis' own timing checks, the
per-example deadline and the `too_slow` health check, fail tests for the machine's load.
The suite's profile turns those two off; a test's own `@settings` still applies on top.

`store_client` runs a store test over both Redis paths of the worker's client.

`refused_port` is a loopback port nothing answers on, held so for the whole test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from worker.store.connection import multiplexed, open_redis
from worker.testing.services import ServiceHandle, refusing_port

settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port every connect to is refused on until the test ends (`refusing_port`): what a
    test of "nothing answers there" names, where a merely free port could be taken by a
    parallel test's server in the meantime."""
    with refusing_port() as port:
        yield port


@pytest.fixture(params=["shared-connection", "redis-py"])
async def store_client(
    request: pytest.FixtureRequest, redis_server: ServiceHandle
) -> AsyncIterator[Any]:
    """The worker's own Redis client (`open_redis`) over each of its two paths: script calls
    on the one shared connection (`worker.store.multiplexed`, what a worker on a single
    server uses) and on redis-py's pooled connections (what TLS, sockets and Redis Cluster
    use). A store test that takes it runs on both and must pass alike."""
    shared = request.param == "shared-connection"
    client = open_redis(redis_server.url, socket_timeout_s=1.0, multiplex=shared)
    assert (multiplexed(client) is not None) is shared
    try:
        yield client
    finally:
        await client.aclose()
