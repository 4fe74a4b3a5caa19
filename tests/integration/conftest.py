from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from tests.integration.stack import Stack, provision_streams, worker_env
from worker.client import AipClient
from worker.testing.fake_hermes import FakeHermes
from worker.testing.identities import write_api_key_file, write_trust_files
from worker.testing.services import ServiceHandle

LEASE_TTL_MS = 3000


@pytest.fixture
async def stack(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> AsyncIterator[Stack]:
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    api_key, key_file = write_api_key_file(tmp_path)
    await provision_streams(nats_server.url, ack_wait_s=LEASE_TTL_MS / 1000)
    async with FakeHermes(api_key=api_key, port=0) as fake:
        env = worker_env(
            nats_server.url, redis_server.url, fake.url, key_file, trust,
            lease_ttl_ms=LEASE_TTL_MS,
        )  # fmt: skip
        nc = await nats.connect(nats_server.url)
        stack = Stack(
            root=tmp_path,
            nats_url=nats_server.url,
            redis_url=redis_server.url,
            fake=fake,
            trust=trust,
            nc=nc,
            client=AipClient(nc, sign_key=trust.seed_file),
            env=env,
        )
        try:
            yield stack
        finally:
            stack.stop_workers()
            await nc.close()
