"""The `/_fake/` control routes, `FakeHermesControl`, and the `python -m` entry point."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from tests.fake_hermes.conftest import API_KEY, events_of, sse_lines, start
from worker.testing.fake_hermes import (
    EventsFlood,
    FakeHermes,
    FakeHermesControl,
    StartDrop,
    StartReject,
)

REPO = Path(__file__).resolve().parents[2]


async def test_stats_count_routes_runs_and_session_starts(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    run_id = await start(client, "count", session_id="s-count")
    await sse_lines(client, run_id)
    await client.get(f"/p/someone/v1/runs/{run_id}")
    async with FakeHermesControl(fake.url) as control:
        stats = await control.stats()
        requests = await control.requests(route="POST /v1/runs")
    assert stats.count("POST /v1/runs") == 1
    assert stats.count("GET /v1/runs/{run_id}") == 1  # the profile prefix is folded in
    assert stats.runs[run_id] == {
        "GET /v1/runs/{run_id}/events": 1,
        "GET /v1/runs/{run_id}": 1,
    }
    assert stats.session_starts == {"s-count": 1}
    (only,) = requests
    assert only.body == {"input": "count", "session_id": "s-count"}
    assert only.headers["Authorization"] == f"Bearer {API_KEY}"
    assert stats == fake.stats()


async def test_control_routes_need_no_key_and_are_not_counted(fake: FakeHermes) -> None:
    async with FakeHermesControl(fake.url) as control:
        await control.stats()
        await control.requests()
        assert (await control.stats()).routes == {}


async def test_faults_can_be_armed_listed_and_cleared_remotely(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    async with FakeHermesControl(fake.url) as control:
        await control.add_faults(StartReject(input_contains="bad"), EventsFlood(count=3))
        assert await control.faults() == [StartReject(input_contains="bad"), EventsFlood(count=3)]
        assert (await client.post("/v1/runs", json={"input": "bad one"})).status_code == 400
        assert [type(f) for f in await control.faults()] == [EventsFlood]
        await control.clear_faults()
        assert await control.faults() == []


async def test_a_bad_fault_body_is_a_400(fake: FakeHermes) -> None:
    async with httpx.AsyncClient(base_url=fake.url) as raw:
        response = await raw.post("/_fake/faults", json={"kind": "no_such_fault"})
        assert response.status_code == 400
        zero = await raw.post("/_fake/faults", json={"kind": "start_drop", "times": 0})
        assert zero.status_code == 400


async def test_reset_clears_stats_and_faults(fake: FakeHermes, client: httpx.AsyncClient) -> None:
    fake.faults.add(StartDrop(times=None))
    await client.get("/v1/models")
    async with FakeHermesControl(fake.url) as control:
        await control.reset()
        assert (await control.stats()).routes == {}
        assert await control.requests() == []
        assert await control.faults() == []


async def test_remote_restart_forgets_runs(fake: FakeHermes, client: httpx.AsyncClient) -> None:
    run_id = await start(client, "before restart")
    async with FakeHermesControl(fake.url) as control:
        await control.restart()
    assert (await client.get(f"/v1/runs/{run_id}")).status_code == 404


@pytest_asyncio.fixture
async def process(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    key_file = tmp_path / "key"
    key_file.write_text(API_KEY + "\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.testing.fake_hermes",
        "--port",
        "0",
        "--api-key-file",
        str(key_file),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        yield line, line.removeprefix("listening on ").strip()
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        assert await proc.stdout.read() == b""  # exactly one line, ever


async def test_module_prints_one_line_and_serves(process: tuple[str, str]) -> None:
    line, url = process
    assert line.startswith("listening on http://127.0.0.1:")
    assert not url.endswith(":0")
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as client:
        run_id = await start(client, "from a subprocess")
        assert events_of(await sse_lines(client, run_id))[-1]["event"] == "run.completed"
    async with FakeHermesControl(url) as control:
        assert (await control.stats()).count("POST /v1/runs") == 1


def test_fake_hermes_needs_a_key() -> None:
    with pytest.raises(ValueError, match="api_key"):
        FakeHermes()
