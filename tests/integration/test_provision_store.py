"""`provision` checks the JetStream store and the nats-server release before it creates
anything (issue 27, item 3; subjects/provision.py `check_store`,
worker/bus/server_requirements.py).

The streams' defaults reserve 9 GiB (9.25 with the runtime stores) that nothing checked: a
store smaller than that filled under load instead. Here a real nats-server gives its account
a 4 GiB JetStream storage limit: `provision` refuses, naming the 5 GiB shortfall, and
creates no stream; with limits that fit it provisions and says so. The release check
refuses a server older than 2.10.23 unless told otherwise, whichever server the harness
has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from worker.bus.server_requirements import MINIMUM_NATS_SERVER, as_tuple, version_problem
from worker.testing.nats_server import NatsServer

MIB = 1024 * 1024
#: The configurable limits at 64 MiB: with the fixed ones (escalations, egress, inbound:
#: 1.5 GiB) the streams reserve 1.88 GiB, which the 4 GiB account holds.
SMALL = {
    f"AIPD_STREAM_{kind}_MAX_BYTES": str(64 * MIB)
    for kind in ("ACTIONS", "DELEGATIONS", "CHUNKS", "RESULTS", "DLQ", "AUDIT")
}

ACCOUNT_WITH_LIMIT = """
jetstream { max_file_store: 64GB }
accounts {
  AIP { jetstream: { max_file: 4GB, max_mem: 64MB }, users: [ { user: aip, password: aip } ] }
}
no_auth_user: aip
"""


@pytest.fixture
def limited_server(tmp_path: Path) -> Iterator[NatsServer]:
    config = tmp_path / "nats.conf"
    config.write_text(ACCOUNT_WITH_LIMIT)
    server = NatsServer(root=tmp_path / "nats", extra_args=["-c", str(config)])
    server.start()
    try:
        yield server
    finally:
        server.close()


def _provision(url: str, *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "provision", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            **os.environ,
            "AIPD_NATS_URL": url,
            "AIPD_HERMES_ENDPOINTS": "h1=http://127.0.0.1:9",
            **env,
        },
    )


async def _server_version(url: str) -> tuple[int, int, int]:
    nc = await nats.connect(url)
    try:
        return as_tuple(nc.connected_server_version)
    finally:
        await nc.close()


async def _stream_names(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        return [info.config.name or "" for info in await nc.jetstream().streams_info()]
    finally:
        await nc.close()


async def test_a_store_too_small_for_the_limits_is_refused_with_the_shortfall(
    limited_server: NatsServer,
) -> None:
    url = limited_server.url
    old = await _server_version(url) < MINIMUM_NATS_SERVER
    allow_old = ("--allow-nats-below-minimum",) if old else ()
    refused = _provision(url, *allow_old)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "the streams reserve 9.00 GiB of the account's 4.00 GiB" in refused.stderr
    assert "short by 5.00 GiB" in refused.stderr
    assert "--allow-store-shortfall" in refused.stderr
    assert await _stream_names(url) == []

    done = _provision(url, *allow_old, **SMALL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fits" in done.stderr
    assert "AIP_HERMES_ACTIONS" in done.stdout


async def test_a_server_older_than_the_minimum_is_refused_unless_allowed(
    limited_server: NatsServer,
) -> None:
    url = limited_server.url
    done = _provision(url, **SMALL)
    if await _server_version(url) < MINIMUM_NATS_SERVER:
        assert done.returncode == 2
        assert "older than 2.10.23" in done.stderr
        assert "jepsen.io/analyses/nats-2.12.1" in done.stderr
        assert await _stream_names(url) == []
    else:
        assert done.returncode == 0, done.stderr
        assert "older than" not in done.stderr


class _Version:
    def __init__(self, major: int, minor: int, patch: int) -> None:
        self.major, self.minor, self.patch = major, minor, patch


@pytest.mark.parametrize(
    ("version", "accepted"),
    [((2, 9, 10), False), ((2, 10, 22), False), ((2, 10, 23), True), ((2, 12, 1), True),
     ((2, 15, 1), True), ((0, 0, 0), False)],
)  # fmt: skip
def test_the_minimum_excludes_the_releases_that_lose_streams(
    version: tuple[int, int, int], accepted: bool
) -> None:
    assert (version_problem(_Version(*version)) is None) is accepted


async def test_runtime_stores_include_the_native_bindings_message_id_bucket(
    limited_server: NatsServer,
) -> None:
    """`--runtime-stores` also creates the native binding's replay guard, which a gateway
    role without stream creation (compose) cannot create itself; a second run keeps it."""
    url = limited_server.url
    old = await _server_version(url) < MINIMUM_NATS_SERVER
    allow_old = ("--allow-nats-below-minimum",) if old else ()
    for _ in range(2):
        done = _provision(url, "--runtime-stores", *allow_old, **SMALL)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "AIP_NATIVE_MESSAGE_IDS: key-value bucket present" in done.stdout
        assert "AIP_HOST_APPROVALS: key-value bucket present" in done.stdout
    names = await _stream_names(url)
    assert "KV_AIP_NATIVE_MESSAGE_IDS" in names
    assert "KV_AIP_HOST_APPROVALS" in names
    assert "AIP_RUNTIME_QUEUE" in names
