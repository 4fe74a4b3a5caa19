from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.integration.stack import ENDPOINT, Stack, fake_stack, provision_streams
from worker.client import AipClient
from worker.testing.fake_hermes import FakeConfig, FakeHermes
from worker.testing.identities import write_api_key_file, write_trust_files
from worker.testing.real_hermes import RealHermes
from worker.testing.services import ServiceHandle

LEASE_TTL_MS = 3000


@pytest.fixture
def stack_env() -> dict[str, str]:
    """Extra `AIPD_*` variables for the stack's workers; a module overrides it to change one
    setting instead of writing its own stack."""
    return {}


@pytest.fixture
def fake_config() -> FakeConfig | None:
    """The fake Hermes' config (None: Hermes 0.19 with the stack's key); a module overrides
    it to run its stack against another behaviour (`worker.testing.fake_hermes.upstream`)."""
    return None


@pytest.fixture
def authority() -> list[dict[str, Any]] | None:
    """The approval authority memberships the stack's trust files hold (None: the usual)."""
    return None


@pytest.fixture
def quorums() -> list[dict[str, Any]] | None:
    """The authority file's approval quorums (None: none, every capability needs one)."""
    return None


@pytest.fixture
async def stack(
    tmp_path: Path,
    nats_server: ServiceHandle,
    redis_server: ServiceHandle,
    stack_env: dict[str, str],
    authority: list[dict[str, Any]] | None,
    quorums: list[dict[str, Any]] | None,
    fake_config: FakeConfig | None,
) -> AsyncIterator[Stack]:
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir, memberships=authority, quorums=quorums)
    async with fake_stack(
        tmp_path,
        nats_server.url,
        redis_server.url,
        trust,
        lease_ttl_ms=LEASE_TTL_MS,
        fake_config=fake_config,
        **stack_env,
    ) as stack:
        yield stack


@pytest.fixture(params=["fake", "real"])
async def route_stack(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    nats_server: ServiceHandle,
    redis_server: ServiceHandle,
) -> AsyncIterator[Stack]:
    """A Stack around the fake Hermes or the real hermes-agent 0.19.0 (the param), for the
    tests that must hold against both; `stack.fake` is None for the real one."""
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    await provision_streams(nats_server.url, ack_wait_s=15)
    api_key, key_file = write_api_key_file(tmp_path)
    if request.param == "fake":
        hermes_cm: Any = FakeHermes(api_key=api_key, port=0)
    else:
        hermes_cm = RealHermes(tmp_path / "hermes", api_key=api_key)
    hermes = await hermes_cm.__aenter__()  # HermesUnavailable: the plugin's skip-or-fail
    nc = await nats.connect(nats_server.url)
    stack = Stack(
        root=tmp_path,
        nats_url=nats_server.url,
        redis_url=redis_server.url,
        fake=hermes if request.param == "fake" else None,
        trust=trust,
        nc=nc,
        client=AipClient(
            nc, sign_key=trust.seed_file, trusted_worker_keys=trust.worker_keys_file
        ),
        env={
            "AIPD_NATS_URL": nats_server.url,
            "AIPD_REDIS_URL": redis_server.url,
            "AIPD_HERMES_ENDPOINTS": f"{ENDPOINT}={hermes.url}",
            "AIPD_HERMES_API_KEY_FILE": str(key_file),
            **trust.environment(),
        },
    )
    try:
        yield stack
    finally:
        stack.stop_workers()
        await nc.close()
        await hermes_cm.__aexit__(None, None, None)
