"""Container-backed handles (forced by the "container" backend, or used when no binary exists
but a Docker engine answers).

They run wherever Docker does, and in CI, where `./dev test --containers` starts an engine
and builds the images locally; with no engine they skip with the reason (see
`require_engine` for when they fail instead).
"""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
import redis

from worker.testing.pytest_plugin import require_engine
from worker.testing.services import docker_available, nats_container, redis_container


@pytest.fixture
def needs_docker() -> None:
    require_engine()


@pytest.mark.chaos
@pytest.mark.containers
@pytest.mark.usefixtures("needs_docker")
async def test_nats_container_keeps_its_stream_across_kill_and_restart() -> None:
    with nats_container() as server:
        nc = await nats.connect(server.url)
        await nc.jetstream().add_stream(name="C", subjects=["c.>"])
        await nc.jetstream().publish("c.1", b"kept")
        await nc.close()

        await asyncio.to_thread(server.kill)
        await asyncio.to_thread(server.restart)

        nc = await nats.connect(server.url)
        try:
            assert (await nc.jetstream().get_msg("C", 1)).data == b"kept"
        finally:
            await nc.close()


@pytest.mark.chaos
@pytest.mark.containers
@pytest.mark.usefixtures("needs_docker")
def test_redis_container_keeps_an_aof_key_across_kill_and_pause() -> None:
    with redis_container() as server:
        client = redis.Redis.from_url(server.url, socket_timeout=0.5)
        try:
            client.set("k", "kept")
            server.kill()
            server.restart()
            assert client.get("k") == b"kept"
            server.pause()
            try:
                with pytest.raises(redis.TimeoutError):
                    client.ping()
            finally:
                server.resume()
            assert client.ping()
        finally:
            client.close()


@pytest.mark.skipif(docker_available(), reason="a Docker engine answers here")
def test_engine_check_answers_no_quickly_when_nothing_listens(
    monkeypatch: pytest.MonkeyPatch, refused_port: int
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{refused_port}")
    started = time.monotonic()

    assert docker_available(timeout=1.0) is False
    assert time.monotonic() - started < 5.0
