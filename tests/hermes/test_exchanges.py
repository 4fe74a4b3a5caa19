"""Each exchange is typed once (`worker.hermes.exchange`) and reported to the app's hook;
the operator's unsafe start maps every answer by its table, and a request that never got a
connection is told apart from one that may have run."""

from __future__ import annotations

import asyncio

import pytest
from scripted_server import API_KEY, Reply, ScriptedServer, make_client

from worker.hermes.exchange import Answer, Exchange
from worker.hermes.http_client import HermesClient, Transport
from worker.operator.provider import (
    START_OUTCOMES,
    START_ROUTE,
    StartAccepted,
    StartRateLimited,
    StartRejected,
    StartUnknown,
    start_run,
)


def test_the_start_table_has_a_row_for_every_answer() -> None:
    assert set(START_OUTCOMES) == set(Answer)


def _hooked(client: HermesClient) -> list[Exchange]:
    heard: list[Exchange] = []
    client.on_exchange = heard.append
    return heard


@pytest.mark.parametrize(
    ("reply", "answer", "outcome"),
    [
        (Reply(status=201, body=b'{"run_id": "run_1"}'), Answer.OK, StartAccepted),
        (Reply(status=200, body=b'{"no": "id"}'), Answer.OK, StartUnknown),
        (Reply(status=429, body=b"{}"), Answer.REFUSED_BEFORE_START, StartRateLimited),
        (
            Reply(status=503, body=b'{"error": {"code": "gateway_draining"}}'),
            Answer.REFUSED_BEFORE_START,
            StartRateLimited,
        ),
        (
            Reply(status=503, body=b'{"error": {"code": "other"}}'),
            Answer.SERVER_ERROR,
            StartUnknown,
        ),
        (Reply(status=401, body=b"{}"), Answer.AUTH, StartRejected),
        (Reply(status=422, body=b"{}"), Answer.CLIENT_ERROR, StartRejected),
        (Reply(status=500, body=b"{}"), Answer.SERVER_ERROR, StartUnknown),
        (Reply(status=302, body=b"", headers={"Location": "/x"}), Answer.UNEXPECTED, StartUnknown),
    ],
)
async def test_a_start_answer_is_typed_reported_and_mapped(
    client: HermesClient, server: ScriptedServer, reply: Reply, answer: Answer, outcome: type
) -> None:
    heard = _hooked(client)
    server.script(START_ROUTE, reply)
    result = await start_run(client, b"{}", {}, timeout_s=5)
    assert isinstance(result, outcome)
    [exchange] = heard
    assert (exchange.method, exchange.route, exchange.status) == ("POST", START_ROUTE, reply.status)
    assert exchange.answer is answer
    assert exchange.endpoint_id == "hermes-1"
    assert exchange.seconds >= 0


async def test_an_oversize_start_reply_is_not_kept_and_the_run_is_unknown(
    client: HermesClient, server: ScriptedServer
) -> None:
    server.script(START_ROUTE, Reply(status=201, body=b'{"run_id": "' + b"x" * 70_000 + b'"}'))
    result = await start_run(client, b"{}", {}, timeout_s=5)
    assert isinstance(result, StartUnknown)
    assert result.remote_status == 201


async def test_a_start_that_times_out_is_unknown_and_reported_without_a_status(
    client: HermesClient, server: ScriptedServer
) -> None:
    heard = _hooked(client)
    server.script(START_ROUTE, Reply(status=201, body=b'{"run_id": "r"}', delay_s=2))
    result = await start_run(client, b"{}", {}, timeout_s=0.2)
    assert isinstance(result, StartUnknown)
    assert "did not answer" in result.reason
    [exchange] = heard
    assert (exchange.answer, exchange.status) == (Answer.TIMED_OUT, None)


async def _start_at(port: int, transport: Transport) -> tuple[object, list[Exchange]]:
    """A start sent by a fresh client to 127.0.0.1:`port`: its outcome, and what was heard."""
    client = make_client(f"http://127.0.0.1:{port}", transport)
    heard = _hooked(client)
    try:
        return await start_run(client, b"{}", {}, timeout_s=5), heard
    finally:
        await client.aclose()


async def test_a_start_that_finds_no_server_was_never_sent(
    transport: Transport, refused_port: int
) -> None:
    result, heard = await _start_at(refused_port, transport)
    assert isinstance(result, StartRateLimited)
    [exchange] = heard
    assert exchange.answer is Answer.NOT_SENT
    assert exchange.failure is not None


async def test_json_and_stream_exchanges_are_reported_too(
    client: HermesClient, server: ScriptedServer
) -> None:
    heard = _hooked(client)
    server.script("/v1/models", Reply(body=b'{"data": []}'))
    await client.request_json("GET", "/v1/models")
    server.script("/v1/runs/run_1", Reply(status=404, body=b"{}"))
    with pytest.raises(Exception, match="404"):
        await client.request_json("GET", "/v1/runs/{run_id}", {"run_id": "run_1"})
    assert [(x.route, x.status, x.answer) for x in heard] == [
        ("/v1/models", 200, Answer.OK),
        ("/v1/runs/{run_id}", 404, Answer.CLIENT_ERROR),
    ]


async def test_a_start_request_is_the_same_over_either_transport(server: ScriptedServer) -> None:
    """Over aiohttp the start is sent on aiohttp itself, and over `h1` on the worker's own
    pool, not through httpx (`HermesClient._open`): Hermes must see the very request httpx
    sends."""
    server.script(START_ROUTE, Reply(status=201, body=b'{"run_id": "run_1"}'))
    body = b'{"input": "x", "session_id": "s"}'
    answers = []
    for transport in ("httpx", "aiohttp", "h1"):
        client = make_client(server.url, transport)
        try:
            exchange = await client.exchange(
                "POST",
                START_ROUTE,
                body,
                {"Authorization": "Bearer forged", "X-AIP-Trace-Id": "t"},
                timeout_s=5,
                max_body_bytes=1024,
            )
        finally:
            await client.aclose()
        answers.append((exchange.answer, exchange.status, exchange.body))
    assert answers == [(Answer.OK, 201, b'{"run_id": "run_1"}')] * 3
    by_httpx, *others = server.seen
    assert (by_httpx.method, by_httpx.path, by_httpx.body) == ("POST", START_ROUTE, body)
    for by_other in others:  # aiohttp's session, then the `h1` pool
        assert (by_other.method, by_other.path, by_other.body) == ("POST", START_ROUTE, body)
        assert sorted(by_other.headers.items()) == sorted(by_httpx.headers.items())
        assert by_other.headers["Authorization"] == f"Bearer {API_KEY}"
        assert by_other.headers["Content-Type"] == "application/json"
        assert by_other.headers["Accept"] == "application/json"


async def test_a_start_whose_connection_breaks_after_it_was_read_may_have_run(
    transport: Transport,
) -> None:
    """A server that reads the whole request and then closes the connection may have
    started the run: the start is `lost` (outcome unknown), never `not_sent`."""
    heard_request = asyncio.Event()

    async def read_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        heard_request.set()
        writer.close()

    listener = await asyncio.start_server(read_then_close, "127.0.0.1", 0)
    try:
        result, heard = await _start_at(listener.sockets[0].getsockname()[1], transport)
    finally:
        listener.close()
        await listener.wait_closed()
    assert heard_request.is_set()
    assert isinstance(result, StartUnknown)
    [exchange] = heard
    assert (exchange.answer, exchange.status) == (Answer.LOST, None)
    assert exchange.failure is not None
