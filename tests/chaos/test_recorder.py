"""The recorder in front of the real Hermes logs what the checker reads, in the fake's shape,
and passes everything else through untouched: SSE as it is written, a refusal as a reset.

The upstream here is a small aiohttp app standing in for Hermes (the real one is exercised
by the real-Hermes campaign, tests/chaos/test_real_campaign.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from tests.chaos.checker import APPROVAL, START, Evidence, Request, approval_once, start_once
from tests.chaos.recorder import HermesRecorder


@dataclass
class Upstream:
    """What the stand-in Hermes saw and controls for the SSE test."""

    seen: list[tuple[str, str, bytes]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    stream_ended: asyncio.Event = field(default_factory=asyncio.Event)


def _app(upstream: Upstream) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        upstream.seen.append((request.method, request.path_qs, body))
        return web.json_response(
            {"path": request.path_qs, "key": request.headers.get("Idempotency-Key")},
            status=202,
            headers={"X-Hermes": "yes"},
        )

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await response.write(b'data: {"event": "message.delta"}\n\n')
            await upstream.release.wait()
            await response.write(b'data: {"event": "run.completed"}\n\n')
            await response.write_eof()
        finally:
            upstream.stream_ended.set()
        return response

    app = web.Application()
    app.router.add_get("/v1/runs/{run_id}/events", events)
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


@pytest.fixture
async def hermes() -> AsyncIterator[tuple[Upstream, HermesRecorder]]:
    upstream = Upstream()
    runner = web.AppRunner(_app(upstream), handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    recorder = await HermesRecorder(runner.addresses[0][1]).start()
    try:
        yield upstream, recorder
    finally:
        await recorder.close()
        await runner.cleanup()


async def test_each_request_is_logged_as_the_fake_logs_it_and_forwarded_unchanged(
    hermes: tuple[Upstream, HermesRecorder],
) -> None:
    upstream, recorder = hermes
    base = f"http://127.0.0.1:{recorder.port}"
    start = {"input": json.dumps({"operator_action_id": "act_1", "objective": "x"})}
    headers = {"Authorization": "Bearer secret-key", "Idempotency-Key": "idem-1"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for _ in range(2):
            async with http.post(f"{base}/v1/runs", json=start) as reply:
                assert reply.status == 202
                assert reply.headers["X-Hermes"] == "yes"
                assert await reply.json() == {"path": "/v1/runs", "key": "idem-1"}
        async with http.post(f"{base}/v1/runs/run_7/approval", json={"choice": "once"}):
            pass
        async with http.get(f"{base}/v1/models?x=1"):
            pass
        async with http.delete(f"{base}/no/such/route"):
            pass
    rows = recorder.requests()
    assert [(r.method, r.path, r.route, r.run_id) for r in rows] == [
        ("POST", "/v1/runs", START, None),
        ("POST", "/v1/runs", START, None),
        ("POST", "/v1/runs/run_7/approval", APPROVAL, "run_7"),
        ("GET", "/v1/models", "GET /v1/models", None),
        ("DELETE", "/no/such/route", "DELETE /no/such/route", None),
    ]
    assert rows[0].body == start
    assert rows[0].headers["Idempotency-Key"] == "idem-1"
    assert "Authorization" not in rows[0].headers, "the API key must not reach the log"
    assert [(m, p) for m, p, _ in upstream.seen] == [
        ("POST", "/v1/runs"),
        ("POST", "/v1/runs"),
        ("POST", "/v1/runs/run_7/approval"),
        ("GET", "/v1/models?x=1"),
        ("DELETE", "/no/such/route"),
    ]
    assert json.loads(upstream.seen[0][2]) == start
    # The checker reads these rows unchanged: two starts of one Action are a violation.
    evidence = Evidence(
        actions={},
        acked=set(),
        requests=[Request(r.route, r.run_id, r.body, r.at) for r in rows],
    )
    assert [v.action_id for v in start_once(evidence)] == ["act_1"]
    assert approval_once(evidence) == []


async def test_an_sse_stream_is_passed_on_as_it_is_written(
    hermes: tuple[Upstream, HermesRecorder],
) -> None:
    upstream, recorder = hermes
    url = f"http://127.0.0.1:{recorder.port}/v1/runs/run_1/events"
    async with aiohttp.ClientSession() as http, http.get(url) as reply:
        assert reply.headers["Content-Type"] == "text/event-stream"
        # The first event arrives while Hermes still holds the stream open: not buffered.
        first = await asyncio.wait_for(reply.content.readline(), 5)
        assert first == b'data: {"event": "message.delta"}\n'
        assert not upstream.stream_ended.is_set()
        upstream.release.set()
        rest = await asyncio.wait_for(reply.content.read(), 5)
    assert rest == b'\ndata: {"event": "run.completed"}\n\n'
    assert recorder.requests()[0].route == "GET /v1/runs/{run_id}/events"


async def test_a_client_going_away_ends_hermes_side_of_the_stream_too(
    hermes: tuple[Upstream, HermesRecorder],
) -> None:
    """Hermes' run stream is single-use and split between concurrent subscribers: a
    subscriber the recorder kept open after the worker left would steal events."""
    upstream, recorder = hermes
    url = f"http://127.0.0.1:{recorder.port}/v1/runs/run_1/events"
    async with aiohttp.ClientSession() as http, http.get(url) as reply:
        await asyncio.wait_for(reply.content.readline(), 5)
        reply.connection.transport.abort()  # type: ignore[union-attr]
    await asyncio.wait_for(upstream.stream_ended.wait(), 5)


async def test_a_request_hermes_refused_is_not_logged_and_the_worker_sees_a_reset(
    refused_port: int,
) -> None:
    recorder = await HermesRecorder(refused_port).start()  # nothing listens upstream
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                async with http.post(f"http://127.0.0.1:{recorder.port}/v1/runs", json={}):
                    pass
        assert recorder.requests() == []
        assert recorder.refused == 1
    finally:
        await recorder.close()


async def test_a_request_held_by_a_delay_is_forwarded_after_it(
    hermes: tuple[Upstream, HermesRecorder],
) -> None:
    upstream, recorder = hermes
    recorder.delays[START] = 0.5
    loop = asyncio.get_running_loop()
    began = loop.time()
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://127.0.0.1:{recorder.port}/v1/runs", json={"input": "x"}) as reply,
    ):
        assert reply.status == 202
    assert loop.time() - began >= 0.5
    assert len(upstream.seen) == 1
