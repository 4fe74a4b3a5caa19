"""The `/v1/runs` quirks of Hermes 0.19.0 that the fake reproduces with shortened timers."""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from tests.fake_hermes.conftest import API_KEY, FAST, events_of, sse_lines, start
from worker.testing.fake_hermes import FakeConfig, FakeHermes, RunStatus
from worker.testing.scenario import NEEDS_APPROVAL, SLOW_REPLY


async def wait_for_status(client: httpx.AsyncClient, run_id: str, status: str) -> None:
    async with asyncio.timeout(5):
        while (await client.get(f"/v1/runs/{run_id}")).json()["status"] != status:
            await asyncio.sleep(0.01)


async def test_silence_sends_keepalive_comments(client: httpx.AsyncClient) -> None:
    run_id = await start(client, f"wait {NEEDS_APPROVAL}")
    lines = await sse_lines(client, run_id)  # nobody answers: the approval times out (0.3 s)
    assert ": keepalive" in lines
    assert lines[-1] == ": stream closed"


async def test_approval_timeout_still_completes_without_a_response_event(
    client: httpx.AsyncClient,
) -> None:
    run_id = await start(client, f"ignored {NEEDS_APPROVAL}")
    events = events_of(await sse_lines(client, run_id))
    names = [e["event"] for e in events]
    assert "approval.responded" not in names
    assert names[:3] == ["tool.started", "approval.request", "tool.completed"]
    assert events[2]["error"] is True
    assert names[-1] == "run.completed"


async def test_alias_choices_mean_once_and_all_resolves_everything(
    client: httpx.AsyncClient,
) -> None:
    run_id = await start(client, f"alias {NEEDS_APPROVAL}")
    await wait_for_status(client, run_id, "waiting_for_approval")
    bad = await client.post(f"/v1/runs/{run_id}/approval", json={"choice": "yes please"})
    assert bad.json()["error"]["code"] == "invalid_approval_choice"
    response = await client.post(
        f"/v1/runs/{run_id}/approval", json={"choice": "Approve", "all": True}
    )
    assert response.json()["choice"] == "once"
    assert response.json()["resolved"] == 1
    events = events_of(await sse_lines(client, run_id))
    assert [e["choice"] for e in events if e["event"] == "approval.responded"] == ["once"]


async def test_two_concurrent_subscribers_split_the_events(client: httpx.AsyncClient) -> None:
    run_id = await start(client, f"split {SLOW_REPLY}")
    first, second = await asyncio.gather(sse_lines(client, run_id), sse_lines(client, run_id))
    one, two = events_of(first), events_of(second)
    assert one
    assert two
    assert len(one) + len(two) == 40 + 2  # every delta, reasoning, completed: once in total
    assert {e["timestamp"] for e in one}.isdisjoint(e["timestamp"] for e in two)


async def test_statuses_move_through_queued_running_stopping_cancelled() -> None:
    # A stop latency long enough that a loaded machine still reads `stopping` after the POST.
    config = FakeConfig(api_key=API_KEY, build_delay_s=0.2, stop_latency_s=1.0)
    async with FakeHermes(config=config) as fake:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(base_url=fake.url, headers=headers) as client:
            run_id = await start(client, f"stages {SLOW_REPLY}")
            assert (await client.get(f"/v1/runs/{run_id}")).json()["status"] == "queued"
            await wait_for_status(client, run_id, "running")
            await client.post(f"/v1/runs/{run_id}/stop")
            assert (await client.get(f"/v1/runs/{run_id}")).json()["status"] == "stopping"
            await wait_for_status(client, run_id, "cancelled")


async def test_stop_while_the_agent_is_built_cancels_without_events() -> None:
    config = FakeConfig(api_key=API_KEY, build_delay_s=0.2, stop_latency_s=0.01)
    async with FakeHermes(config=config) as fake:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(base_url=fake.url, headers=headers) as client:
            run_id = await start(client, "stop me early")
            await client.post(f"/v1/runs/{run_id}/stop")
            events = events_of(await sse_lines(client, run_id))
            assert [e["event"] for e in events] == ["run.cancelled"]


async def test_cap_is_shared_with_chat_completions_but_not_session_chat(
    fake: FakeHermes, client: httpx.AsyncClient
) -> None:
    run_ids = [await start(client, f"{i} {SLOW_REPLY}") for i in range(10)]
    try:
        assert fake.state.runs.active_runs == 10
        chat = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert chat.status_code == 429
        assert (await client.post("/v1/responses", json={"input": "hi"})).status_code == 429
        sid = (await client.post("/api/sessions", json={})).json()["session"]["id"]
        session_chat = await client.post(f"/api/sessions/{sid}/chat", json={"message": "hi"})
        assert session_chat.status_code == 200
        detailed = (await client.get("/health/detailed")).json()
        assert detailed["readiness"]["checks"]["background_queues"]["active_api_runs"] == 10
    finally:
        for run_id in run_ids:
            await client.post(f"/v1/runs/{run_id}/stop")
    for run_id in run_ids:
        await wait_for_status(client, run_id, "cancelled")
    assert (await client.post("/v1/runs", json={"input": "room again"})).status_code == 202


async def test_terminal_runs_expire_and_unread_buffers_are_swept() -> None:
    config = FakeConfig(
        api_key=API_KEY,
        build_delay_s=0,
        terminal_retention_s=0.5,
        unsubscribed_stream_ttl_s=0.2,
        missing_stream_delay_s=0,
    )
    async with FakeHermes(config=config) as fake:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(base_url=fake.url, headers=headers) as client:
            run_id = await start(client, "short lived")
            await wait_for_status(client, run_id, "completed")
            run = fake.state.runs.get(run_id)
            assert run is not None
            assert run.status is RunStatus.COMPLETED
            async with asyncio.timeout(3):
                while not run.channel.dropped:
                    await asyncio.sleep(0.05)
            assert (await client.get(f"/v1/runs/{run_id}/events")).status_code == 404
            async with asyncio.timeout(3):
                while (await client.get(f"/v1/runs/{run_id}")).status_code != 404:
                    await asyncio.sleep(0.05)


async def test_zero_build_delay_still_buffers_every_event() -> None:
    config = FakeConfig(api_key=API_KEY, build_delay_s=0)
    async with FakeHermes(config=config) as fake:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(base_url=fake.url, headers=headers) as client:
            run_id = await start(client, "fast one")
            names = [e["event"] for e in events_of(await sse_lines(client, run_id))]
            assert names[-2:] == ["reasoning.available", "run.completed"]


async def test_a_subscriber_that_leaves_consumes_the_stream(client: httpx.AsyncClient) -> None:
    run_id = await start(client, f"leave early {SLOW_REPLY}")
    async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                break
    async with asyncio.timeout(5):
        while True:
            again = await client.get(f"/v1/runs/{run_id}/events")
            if again.status_code == 404:
                break
            await asyncio.sleep(0.05)
    assert (await client.get(f"/v1/runs/{run_id}")).json()["status"] == "running"
    await client.post(f"/v1/runs/{run_id}/stop")


async def test_bad_bodies_are_400s(client: httpx.AsyncClient) -> None:
    not_json = await client.post("/v1/runs", content=b"{nope")
    assert not_json.json()["error"]["message"] == "Invalid JSON"
    bad_history = await client.post(
        "/v1/runs", json={"input": "x", "conversation_history": [{"role": "user"}]}
    )
    assert bad_history.json()["error"]["message"] == (
        "conversation_history[0] must have 'role' and 'content' fields"
    )
    wrong_type = await client.post("/v1/runs", json={"input": 5})
    assert wrong_type.json()["error"]["message"] == "No user message found in input"


async def test_an_input_array_uses_its_last_message(client: httpx.AsyncClient) -> None:
    run_id = await start(
        client,
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "array last"},
        ],
    )
    events = events_of(await sse_lines(client, run_id))
    assert events[-1]["output"] == "fake-reply: array last"


async def test_server_shutdown_does_not_wait_for_hanging_streams() -> None:
    async with FakeHermes(config=FAST) as fake:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        client = httpx.AsyncClient(base_url=fake.url, headers=headers)
        run_id = await start(client, f"{NEEDS_APPROVAL}")
        reader = asyncio.create_task(sse_lines(client, run_id))
        await asyncio.sleep(0.05)
    with contextlib.suppress(httpx.HTTPError):
        await reader
    await client.aclose()
