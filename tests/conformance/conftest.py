"""The `hermes` fixture: the same HTTP tests run against the fake and the real Hermes 0.19.0,
and against the fake with its post-0.19 flags (`fake-upstream`: what upstream Hermes added
after 0.19, `worker.testing.fake_hermes.upstream`), so the suite pins both behaviours.

Every server is session-scoped (the real one costs seconds to start). When the real Hermes
cannot be installed, its half of the suite fails under `CI=true` and is skipped otherwise.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
import pytest
import pytest_asyncio

from worker.testing.fake_hermes import FakeConfig, FakeHermes, upstream
from worker.testing.pytest_plugin import service_unavailable


@dataclass(frozen=True)
class Hermes:
    """One server under test: where it is, its key, how to restart it, and the fake if any.
    `kind` is `fake`, `real` (both Hermes 0.19.0) or `fake-upstream` (after 0.19)."""

    kind: str
    url: str
    api_key: str
    restart: Callable[[], Awaitable[None]]
    fake: FakeHermes | None

    def require_fake(self) -> FakeHermes:
        """Skip on the real server: the test observes something only the fake can show."""
        if self.fake is None:
            pytest.skip("fake-only: observes the fake's stats or faults")
        return self.fake

    @property
    def upstream(self) -> bool:
        """True for the post-0.19 behaviour (durable run keys, `interrupted`, …)."""
        return self.kind == UPSTREAM


async def _real(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Hermes]:
    try:
        from worker.testing.real_hermes import RealHermes, ensure_hermes_venv
    except ImportError as exc:
        service_unavailable(f"worker.testing.real_hermes is not available: {exc}")
    await asyncio.to_thread(ensure_hermes_venv)
    async with RealHermes(tmp_path_factory.mktemp("real-hermes")) as real:
        yield Hermes("real", real.url, real.api_key, real.restart, None)


UPSTREAM = "fake-upstream"


@pytest_asyncio.fixture(scope="session", loop_scope="session", params=["fake", "real", UPSTREAM])
async def hermes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Hermes]:
    """The server under test (parametrized: `fake`, `real`, `fake-upstream`)."""
    if request.param == "real":
        async for real in _real(tmp_path_factory):
            yield real
        return
    config = FakeConfig(api_key=secrets.token_urlsafe(32))
    if request.param == UPSTREAM:
        config = upstream(config)
    async with FakeHermes(config=config) as fake:
        yield Hermes(request.param, fake.url, fake.api_key, fake.restart, fake)


@pytest_asyncio.fixture(loop_scope="session")
async def client(hermes: Hermes) -> AsyncIterator[httpx.AsyncClient]:
    """An authenticated client for the server under test."""
    headers = {"Authorization": f"Bearer {hermes.api_key}"}
    async with httpx.AsyncClient(base_url=hermes.url, headers=headers, timeout=30.0) as http:
        yield http
