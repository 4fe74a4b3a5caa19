from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.stack import Stack, fake_stack
from worker.testing.identities import write_trust_files
from worker.testing.services import ServiceHandle

LEASE_TTL_MS = 3000


@pytest.fixture
async def stack(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> AsyncIterator[Stack]:
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    async with fake_stack(
        tmp_path, nats_server.url, redis_server.url, trust, lease_ttl_ms=LEASE_TTL_MS
    ) as stack:
        yield stack
