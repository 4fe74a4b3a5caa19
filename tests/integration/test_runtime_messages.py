"""What a worker says when something it depends on is missing (issue 28, item 3).

Real processes throughout: a worker subprocess, its own nats-server (killed and restarted
here), a nats-server started without JetStream, a port held by this test.
Before: NATS down logged `ConnectionRefusedError` twice a second with no URL; a NATS
without JetStream logged "bound to consumer" seven times a second; a busy metrics port
said "check AIPD_NATS_URL"; a drain said nothing of what it waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from schemas.result import ResultStatus
from tests.integration.conftest import LEASE_TTL_MS
from tests.integration.stack import Stack, fake_stack
from tests.nats_process import nats_process
from worker.testing.identities import write_trust_files
from worker.testing.nats_server import NatsServer
from worker.testing.scenario import SLOW_REPLY
from worker.testing.services import ServiceHandle, eventually

#: How long NATS stays down in the outage test.
OUTAGE_S = 6.0


def _records(text: str) -> list[dict[str, object]]:
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict):
                out.append(doc)
    return out


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server this test may kill and restart (same port, same store)."""
    with NatsServer(root=tmp_path / "nats") as server:
        yield server


@pytest.fixture
async def own_stack(
    tmp_path: Path, own_nats: NatsServer, redis_server: ServiceHandle
) -> AsyncIterator[Stack]:
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    async with fake_stack(
        tmp_path, own_nats.url, redis_server.url, trust, lease_ttl_ms=LEASE_TTL_MS
    ) as stack:
        yield stack


async def test_nats_down_for_seconds_is_logged_a_bounded_number_of_times_with_its_url(
    own_stack: Stack, own_nats: NatsServer
) -> None:
    worker = await own_stack.spawn("w1")
    before = len(_records(worker.log_text()))
    await own_stack.nc.close()
    own_nats.kill()
    await asyncio.sleep(OUTAGE_S)
    during = _records(worker.log_text())[before:]
    own_nats.start()
    await eventually(
        lambda: "answers again" in worker.log_text(), within=30, what=worker.log_tail()
    )
    warnings = [r for r in during if r["level"] in ("warning", "error")]
    # nats-py calls back on every reconnect attempt (twice a second: ~12 in the outage);
    # the worker says it once per cause per 10 s, and each pull loop once per cause.
    assert 1 <= len(warnings) <= 8, json.dumps(warnings, indent=1)
    nats_lines = [str(r["msg"]) for r in warnings if str(r["msg"]).startswith("nats at ")]
    assert nats_lines, warnings
    for line in nats_lines:
        assert own_nats.url in line, line
        assert "check AIPD_NATS_URL" in line, line
    assert any("is unreachable" in line for line in nats_lines), nats_lines
    # And it serves again on its own.
    import nats

    own_stack.nc = await nats.connect(own_nats.url)
    own_stack.client.nc = own_stack.nc
    handle = await own_stack.publish(own_stack.action("models"))
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error


async def test_redis_url_in_the_worker_log_has_no_password(
    stack: Stack, redis_server: ServiceHandle, refused_port: int
) -> None:
    """A Redis that refuses connections is named by its URL, never with its password."""
    dead = refused_port
    worker = await stack.spawn(
        "w1", wait=False, AIPD_REDIS_URL=f"redis://user:s3cret-pw@127.0.0.1:{dead}/0",
        AIPD_REDIS_STARTUP_WAIT_S="2",
    )
    assert await asyncio.to_thread(worker.wait_exit, 30) == 3, worker.log_tail()
    text = worker.log_text()
    assert f"waiting for redis at 127.0.0.1:{dead}" in text, text
    assert "check AIPD_REDIS_URL" in text, text
    assert "s3cret-pw" not in text


@pytest.fixture
def nats_without_jetstream(tmp_path: Path) -> Iterator[str]:
    with nats_process(log=tmp_path / "plain-nats.log") as url:  # no -js: JetStream off
        yield url


async def test_a_nats_without_jetstream_stops_start_up_with_that_sentence(
    stack: Stack, nats_without_jetstream: str
) -> None:
    worker = await stack.spawn(
        "w1", wait=False, AIPD_NATS_URL=nats_without_jetstream, AIPD_AUTO_PROVISION="false"
    )
    code = await asyncio.to_thread(worker.wait_exit, 30)
    text = worker.log_text()
    assert code == 3, text
    assert f"NATS at {nats_without_jetstream} answers but has no JetStream" in text, text
    assert "start nats-server with -js" in text
    assert "bound to consumer" not in text
    assert "Traceback" not in text


async def test_a_busy_metrics_port_names_its_setting_before_anything_is_consumed(
    stack: Stack,
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        worker = await stack.spawn(
            "w1", wait=False, AIPD_METRICS_HOST="127.0.0.1", AIPD_METRICS_PORT=str(port)
        )
        code = await asyncio.to_thread(worker.wait_exit, 30)
    text = worker.log_text()
    assert code == 2, text
    assert f"port {port} on 127.0.0.1 is already in use" in text, text
    assert "AIPD_METRICS_PORT" in text
    assert "AIPD_NATS_URL" not in text
    assert "bound to consumer" not in text
    assert "Traceback" not in text


async def test_a_sigterm_drain_says_what_it_waits_for(stack: Stack) -> None:
    worker = await stack.spawn("w1", AIPD_SHUTDOWN_GRACE_S="30")
    action, handle = await stack.operator(f"{SLOW_REPLY} drain me")
    await stack.wait_bound(action.id)
    code = await asyncio.to_thread(worker.terminate, 60)
    assert code == 0, worker.log_tail()
    [line] = [
        str(r["msg"]) for r in _records(worker.log_text()) if str(r["msg"]).startswith("drain:")
    ]
    assert "waiting up to 30 s (AIPD_SHUTDOWN_GRACE_S) for 1 run(s) to finish" in line, line
    assert f"{action.id} ({action.capability})" in line, line
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.settled_by == "w1"


async def test_a_drain_with_nothing_running_says_so(stack: Stack) -> None:
    worker = await stack.spawn("w1")
    assert await asyncio.to_thread(worker.terminate, 30) == 0
    assert "drain: no run in progress; stopping" in worker.log_text()


async def test_nats_refusing_the_worker_names_the_credential_settings(
    stack: Stack, tmp_path: Path
) -> None:
    """A nats-server with a user the worker does not present: the cause and the
    credential settings, once per interval, not a reconnect line twice a second."""
    with nats_process(
        "-js", "-sd", str(tmp_path / "js"), "--user", "someone", "--pass", "not-the-worker",
        log=tmp_path / "auth-nats.log",
    ) as url:
        worker = await stack.spawn("w1", wait=False, AIPD_NATS_URL=url)
        await eventually(
            lambda: "refused this worker" in worker.log_text(), within=60, what=worker.log_tail()
        )
        # nats-py tries again every 0.5 s: six more attempts, none of them a new line.
        await asyncio.sleep(3.0)
        lines = [
            str(r["msg"]) for r in _records(worker.log_text())
            if str(r["msg"]).startswith("nats at ")
        ]
        assert lines, worker.log_tail()
        assert len(lines) <= 2, lines
        assert f"nats at {url} refused this worker" in lines[0], lines
        assert "check the AIPD_NATS_* credential settings" in lines[0], lines
        assert "not-the-worker" not in worker.log_text()
