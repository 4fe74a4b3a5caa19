"""Operations under test: a small ExecutionContext and the Hermes server(s) they talk to.

`tests.recording.RecordingContext` implements the runtime's `ExecutionContext` protocol with
nothing but what an operation may observe: the chunks it emitted, the headers it must send,
the deadline.
The `hermes` fixture is parametrized over the fake Hermes and the real `hermes-agent==0.19.0`
(marked `real_hermes`; deselect with `-m 'not real_hermes'`). When the real one cannot be
installed its half fails under `CI=true` and is skipped otherwise, like the conformance suite.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from ops_harness import (
    HermesServer,
    Invocation,
    Invoke,
    endpoint_for,
    make_action,
)

from schemas.codec import convert_input
from schemas.result import ResultStatus
from tests.recording import RecordingContext
from worker.errors import ConnectorError
from worker.hermes.http_client import HermesClient, Transport
from worker.operations.base import Operation, Outcome, Registry
from worker.operations.registry import default_registry
from worker.testing.fake_hermes import FakeConfig, FakeHermes
from worker.testing.pytest_plugin import service_unavailable


async def _real(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[HermesServer]:
    try:
        from worker.testing.real_hermes import RealHermes, ensure_hermes_venv
    except ImportError as exc:
        service_unavailable(f"worker.testing.real_hermes is not importable: {exc}")
    await asyncio.to_thread(ensure_hermes_venv)
    async with RealHermes(tmp_path_factory.mktemp("ops-real-hermes")) as real:
        yield HermesServer("real", real.url, real.api_key, None)


@pytest_asyncio.fixture(
    scope="session",
    loop_scope="session",
    params=["fake", pytest.param("real", marks=pytest.mark.real_hermes)],
)
async def hermes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[HermesServer]:
    """The server under test (parametrized: `fake`, `real`)."""
    if request.param == "real":
        async for real in _real(tmp_path_factory):
            yield real
        return
    config = FakeConfig(api_key=secrets.token_urlsafe(32), missing_stream_delay_s=0.05)
    async with FakeHermes(config=config) as fake:
        yield HermesServer("fake", fake.url, fake.api_key, fake)


@pytest_asyncio.fixture(loop_scope="session", params=["aiohttp"])
async def hermes_client(
    request: pytest.FixtureRequest, hermes: HermesServer
) -> AsyncIterator[HermesClient]:
    transport: Transport = request.param
    client = HermesClient(endpoint_for(hermes.url, hermes.api_key), transport=transport)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def registry() -> Registry:
    return default_registry()


@pytest.fixture
def invoke(hermes_client: HermesClient, registry: Registry) -> Invoke:
    """`await invoke("run_start", {...})`: validate input, execute, capture the outcome."""

    async def call(
        name: str,
        input_value: dict[str, Any],
        *,
        client: HermesClient | None = None,
        operation: Operation | None = None,
        deadline_s: float = 30.0,
        idempotency_key: str | None = None,
    ) -> Invocation:
        op = operation or registry.get(name)
        assert op is not None, name
        action = make_action(
            name,
            input_value,
            idempotency_key=idempotency_key or ("idem-" + secrets.token_hex(8)),
            deadline_s=deadline_s,
        )
        hermes = client or hermes_client
        ctx = RecordingContext(action=action, endpoint=hermes.endpoint, hermes=hermes)
        params = convert_input(action.input, op.spec.input_type)
        try:
            outcome = await op.execute(ctx, params)
        except ConnectorError as exc:
            outcome = Outcome(ResultStatus.FAILED, None, exc)
        return Invocation(outcome, ctx, op)

    return call
