"""Each injected fault does exactly what its docstring promises, and only to its target."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.fake_hermes.conftest import events_of, sse_lines, start
from worker.testing.fake_hermes import (
    EventsDisconnect,
    EventsFlood,
    EventsHang,
    EventsHugeAnswer,
    EventsMalformed,
    EventsNoise,
    EventsNotFound,
    EventsOversize,
    EventsSlow,
    FakeHermes,
    Faults,
    RouteDelay,
    RouteError,
    RouteRedirect,
    StartDrop,
    StartHang,
    StartNoRunId,
    StartReject,
    StartServerError,
)
from worker.testing.scenario import SLOW_REPLY


async def test_start_server_error_creates_the_run_but_answers_500(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    fake.faults.add(StartServerError())
    response = await client.post("/v1/runs", json={"input": "hello", "session_id": "s-500"})
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"
    assert fake.stats().session_starts == {"s-500": 1}
    # The next start is healthy again: the fault fired once.
    assert (await client.post("/v1/runs", json={"input": "hello"})).status_code == 202


async def test_start_drop_creates_the_run_and_sends_nothing(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    fake.faults.add(StartDrop())
    with pytest.raises(httpx.RemoteProtocolError):
        await client.post("/v1/runs", json={"input": "hello", "session_id": "s-drop"})
    assert fake.stats().session_starts == {"s-drop": 1}
    assert fake.stats().count("POST /v1/runs") == 1


async def test_start_no_run_id_is_a_2xx_without_the_id(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    fake.faults.add(StartNoRunId(status=200))
    response = await client.post("/v1/runs", json={"input": "hello", "session_id": "s-noid"})
    assert response.status_code == 200
    assert response.json() == {"status": "started"}
    assert fake.stats().session_starts == {"s-noid": 1}


async def test_start_reject_creates_nothing(fake: FakeHermes, client: httpx.AsyncClient) -> None:
    fake.faults.add(StartReject(status=422, code="nope", message="refused"))
    response = await client.post("/v1/runs", json={"input": "hello"})
    assert response.status_code == 422
    assert response.json() == {
        "error": {
            "message": "refused",
            "type": "invalid_request_error",
            "param": None,
            "code": "nope",
        }
    }
    assert fake.stats().session_starts == {}


@pytest.mark.parametrize("create_run", [False, True])
async def test_start_hang_never_answers(
    fake: FakeHermes, client: httpx.AsyncClient, create_run: bool
) -> None:
    fake.faults.add(StartHang(create_run=create_run))
    with pytest.raises(httpx.ReadTimeout):
        await client.post("/v1/runs", json={"input": "hello", "session_id": "s-hang"}, timeout=0.3)
    assert fake.stats().session_starts == ({"s-hang": 1} if create_run else {})


async def test_restart_releases_a_hanging_start(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    fake.faults.add(StartHang())
    pending = asyncio.create_task(client.post("/v1/runs", json={"input": "hello"}))
    await asyncio.sleep(0.1)
    assert not pending.done()
    await fake.restart()
    with pytest.raises(httpx.RemoteProtocolError):
        await pending


async def test_input_contains_targets_exactly_one_action(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    fake.faults.add(StartServerError(input_contains="victim", times=None))
    statuses = [
        (await client.post("/v1/runs", json={"input": text})).status_code
        for text in ("bystander", "the victim", "another bystander", "victim again")
    ]
    assert statuses == [202, 500, 202, 500]
    assert len(fake.faults.armed()) == 1  # times=None stays armed


async def test_times_counts_down_and_disarms(fake: FakeHermes, client: httpx.AsyncClient) -> None:
    fake.faults.add(StartReject(times=2))
    assert fake.faults.armed()[0].times == 2
    statuses = [(await client.post("/v1/runs", json={"input": "x"})).status_code for _ in "abc"]
    assert statuses == [400, 400, 202]
    assert fake.faults.armed() == []


def test_times_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="times"):
        Faults().add(StartDrop(times=0))


async def test_events_not_found_leaves_the_stream_unconsumed(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    run_id = await start(client, "hello")
    fake.faults.add(EventsNotFound(run_id=run_id))
    first = await client.get(f"/v1/runs/{run_id}/events")
    assert first.status_code == 404
    assert first.json()["error"]["code"] == "run_not_found"
    assert events_of(await sse_lines(client, run_id))[-1]["event"] == "run.completed"


async def test_events_hang_sends_no_status_line(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    run_id = await start(client, "hello")
    fake.faults.add(EventsHang())
    with pytest.raises(httpx.ReadTimeout):
        await client.get(f"/v1/runs/{run_id}/events", timeout=0.3)
    # The buffer was never claimed, so a retry still gets every event.
    assert events_of(await sse_lines(client, run_id))[-1]["event"] == "run.completed"


async def test_events_slow_holds_back_every_frame(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    run_id = await start(client, "one two")
    fake.faults.add(EventsSlow(delay_s=0.05))
    loop = asyncio.get_running_loop()
    began = loop.time()
    events = events_of(await sse_lines(client, run_id))
    assert loop.time() - began >= 0.05 * len(events)
    assert events[-1]["event"] == "run.completed"


async def test_events_malformed_inserts_one_bad_frame(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    run_id = await start(client, "hello")
    fake.faults.add(EventsMalformed(after=1))
    data = [line for line in await sse_lines(client, run_id) if line.startswith("data: ")]
    bad = []
    for index, line in enumerate(data):
        try:
            json.loads(line[6:])
        except ValueError:
            bad.append(index)
    assert bad == [1]
    assert json.loads(data[-1][6:])["event"] == "run.completed"


async def test_events_oversize_sends_one_frame_over_a_mebibyte(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    run_id = await start(client, "hello")
    fake.faults.add(EventsOversize())
    data = [line for line in await sse_lines(client, run_id) if line.startswith("data: ")]
    sizes = [len(line) for line in data]
    assert sizes[0] > 1024 * 1024
    assert all(size < 4096 for size in sizes[1:])
    assert json.loads(data[0][6:])["event"] == "message.delta"


async def test_events_flood_prepends_n_events(fake: FakeHermes, client: httpx.AsyncClient) -> None:
    run_id = await start(client, "hello")
    fake.faults.add(EventsFlood(count=5000))
    events = events_of(await sse_lines(client, run_id))
    assert sum(1 for e in events if e.get("delta") == ".") == 5000
    assert events[-1]["event"] == "run.completed"


@pytest.mark.parametrize(
    ("noise", "unit"), [("blank_lines", b"\n"), ("comments", b": keepalive\n\n")]
)
async def test_events_noise_sends_lines_that_are_never_an_event(
    fake: FakeHermes, client: httpx.AsyncClient, noise: str, unit: bytes
) -> None:
    run_id = await start(client, "hello")
    fake.faults.add(EventsNoise(noise=noise, max_bytes=300_000))  # type: ignore[arg-type]
    async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        assert response.status_code == 200
        body = b"".join([piece async for piece in response.aiter_bytes()])
    assert len(body) >= 300_000
    assert body == unit * (len(body) // len(unit))  # nothing but the noise, no event
    # The stream counts as consumed, like any other that ended.
    assert (await client.get(f"/v1/runs/{run_id}/events")).status_code == 404


async def test_events_noise_stops_when_the_client_leaves(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    run_id = await start(client, "hello")
    fake.faults.add(EventsNoise(noise="comments"))
    async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        async for _ in response.aiter_bytes():
            break
    # The writer noticed the client left (it is not still writing 256 MiB into nowhere).
    for _ in range(100):
        if not len(fake.state.connections):
            break
        await asyncio.sleep(0.05)
    assert not len(fake.state.connections)


async def test_events_huge_answer_sends_the_answer_in_frames_before_the_run(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    run_id = await start(client, "hello")
    fake.faults.add(EventsHugeAnswer(size=2 * 1024 * 1024, piece=64 * 1024))
    events = events_of(await sse_lines(client, run_id))
    huge = [e for e in events if e.get("delta") == "x" * 64 * 1024]
    assert len(huge) == 32
    assert events[-1]["event"] == "run.completed"


async def test_events_disconnect_cuts_after_k_events_and_consumes_the_stream(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    run_id = await start(client, "hello there")
    fake.faults.add(EventsDisconnect(after=2))
    received: list[str] = []

    async def read() -> None:
        async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    received.append(line)

    with pytest.raises(httpx.RemoteProtocolError):
        await read()
    assert len(received) == 2
    again = await client.get(f"/v1/runs/{run_id}/events")
    assert again.status_code == 404


async def test_redirect_points_elsewhere_and_is_not_followed(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    fake.faults.add(RouteRedirect(route="POST /v1/runs", location="http://127.0.0.2:9/x"))
    response = await client.post("/v1/runs", json={"input": "hello"})
    assert response.status_code == 307
    assert response.headers["Location"] == "http://127.0.0.2:9/x"
    assert fake.stats().session_starts == {}


async def test_route_error_only_hits_its_route(fake: FakeHermes, client: httpx.AsyncClient) -> None:
    run_id = await start(client, "hello")
    fake.faults.add(RouteError(route="GET /v1/runs/{run_id}", status=503, times=None))
    assert (await client.get(f"/v1/runs/{run_id}")).status_code == 503
    assert (await client.get("/v1/models")).status_code == 200


async def test_delay_postpones_but_still_answers(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    fake.faults.add(RouteDelay(route="GET /v1/models", delay_s=0.2))
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert (await client.get("/v1/models")).status_code == 200
    assert loop.time() - began >= 0.2


async def test_restart_cuts_an_open_stream_and_forgets_the_run(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    run_id = await start(client, f"long {SLOW_REPLY}")

    async def read() -> None:
        async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
            async for _ in response.aiter_lines():
                pass

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.2)
    await fake.restart()
    with pytest.raises(httpx.RemoteProtocolError):
        await reader
    assert (await client.get(f"/v1/runs/{run_id}")).status_code == 404
