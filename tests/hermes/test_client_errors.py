"""The client maps every provider and transport outcome exactly as the troubleshooting table
says, never follows a redirect, never exposes a provider body, and never shows its key."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import traceback
from typing import Any

import msgspec
import pytest
from scripted_server import API_KEY, SSE_HEADERS, Reply, ScriptedServer, make_client, sse

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.hermes.http_client import MAX_JSON_BODY_BYTES, HermesClient, Transport

PROVIDER_BODY = b'{"error": {"message": "provider-secret-detail PROVIDER-BODY-MARKER"}}'


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, ErrorCode.REMOTE_REJECTED),
        (401, ErrorCode.AUTHENTICATION),
        (403, ErrorCode.AUTHENTICATION),
        (404, ErrorCode.REMOTE_REJECTED),
        (409, ErrorCode.REMOTE_REJECTED),
        (413, ErrorCode.REMOTE_REJECTED),
        (429, ErrorCode.REMOTE_TEMPORARY),
        (500, ErrorCode.REMOTE_TEMPORARY),
        (502, ErrorCode.REMOTE_TEMPORARY),
        (503, ErrorCode.REMOTE_TEMPORARY),
        (599, ErrorCode.REMOTE_TEMPORARY),
        (301, ErrorCode.REMOTE_REJECTED),
        (302, ErrorCode.REMOTE_REJECTED),
        (304, ErrorCode.REMOTE_REJECTED),
        (307, ErrorCode.REMOTE_REJECTED),
        (308, ErrorCode.REMOTE_REJECTED),
    ],
)
async def test_non_2xx_maps_to_the_table_and_keeps_the_remote_status(
    client: HermesClient, server: ScriptedServer, status: int, code: ErrorCode
) -> None:
    # A 304 may not carry a body; every other status carries the provider's.
    body = b"" if status == 304 else PROVIDER_BODY
    server.script("/v1/models", Reply(status=status, body=body))
    with pytest.raises(ConnectorError) as caught:
        await client.request_json("GET", "/v1/models")
    assert caught.value.code is code
    assert caught.value.remote_status == status
    assert b"PROVIDER-BODY-MARKER" not in caught.value.message.encode()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_redirects_are_never_followed_so_the_key_stays_home(
    transport: Transport, server: ScriptedServer, other_origin: ScriptedServer, status: int
) -> None:
    other_origin.script("/stolen", Reply(body=b"{}"))
    server.script(
        "/v1/runs",
        Reply(status=status, headers={"Location": other_origin.url + "/stolen"}, body=b""),
    )
    client = make_client(server.url, transport)
    try:
        with pytest.raises(ConnectorError) as caught:
            await client.request_json("POST", "/v1/runs", json_body={"input": "x"})
        with pytest.raises(ConnectorError) as caught_stream:
            async with client.stream_sse("POST", "/v1/runs", json_body={"input": "x"}):
                pass
    finally:
        await client.aclose()
    for error in (caught.value, caught_stream.value):
        assert (error.code, error.remote_status) == (ErrorCode.REMOTE_REJECTED, status)
    assert other_origin.seen == []
    assert len(server.seen) == 2


async def test_the_key_is_sent_as_bearer_and_only_on_protected_routes(
    client: HermesClient, server: ScriptedServer
) -> None:
    server.script("/health", Reply(body=b'{"status": "ok"}'))
    server.script("/v1/models", Reply(body=b'{"data": []}'))
    await client.request_json("GET", "/health", protected=False)
    await client.request_json("GET", "/v1/models")
    assert "Authorization" not in server.seen[0].headers
    assert server.seen[1].headers["Authorization"] == f"Bearer {API_KEY}"


async def test_caller_headers_cannot_replace_the_key_or_content_type(
    client: HermesClient, server: ScriptedServer
) -> None:
    server.script("/v1/runs", Reply(body=b"{}"))
    await client.request_json(
        "POST",
        "/v1/runs",
        json_body={"input": "x"},
        headers={
            "Authorization": "Bearer forged",
            "Content-Type": "text/plain",
            "X-AIP-Trace-Id": "t",
        },
    )
    seen = server.seen[0].headers
    assert seen["Authorization"] == f"Bearer {API_KEY}"
    assert seen["Content-Type"] == "application/json"
    assert seen["X-AIP-Trace-Id"] == "t"


async def test_an_event_stream_request_is_the_same_over_either_transport(
    server: ScriptedServer,
) -> None:
    """Over aiohttp an event stream's request is sent on aiohttp itself, and over `h1` on the
    worker's own pool, not through httpx (`HermesClient._open`): Hermes must see the very
    request httpx sends."""
    path = "/v1/runs/run%201/events?after=a+b&full=true"
    server.script(path, Reply(headers=SSE_HEADERS, body=[sse('data: {"event": "x"}\n\n')]))
    for transport in ("httpx", "aiohttp", "h1"):
        client = make_client(server.url, transport)
        try:
            async with client.stream_sse(
                "POST",
                "/v1/runs/{run_id}/events",
                {"run_id": "run 1"},
                json_body={"input": "x"},
                query={"after": "a b", "full": True, "none": None},
                headers={"Authorization": "Bearer forged", "X-AIP-Trace-Id": "t"},
            ) as stream:
                assert [event.name async for event in stream] == ["x"]
        finally:
            await client.aclose()
    by_httpx, *others = server.seen
    assert by_httpx.path == path
    for by_other in others:  # aiohttp's session, then the `h1` pool
        assert (by_other.method, by_other.path, by_other.body) == (
            by_httpx.method, by_httpx.path, by_httpx.body,
        )  # fmt: skip
        assert sorted(by_other.headers.items()) == sorted(by_httpx.headers.items())
        assert by_other.headers["Authorization"] == f"Bearer {API_KEY}"
        assert by_other.headers["Accept"] == "text/event-stream"
        assert by_other.headers["Accept-Encoding"] == "identity"


async def test_a_protected_route_without_a_key_sends_nothing(
    server: ScriptedServer, transport: Transport
) -> None:
    client = make_client(server.url, transport, key=None)
    try:
        with pytest.raises(ConnectorError) as caught:
            await client.request_json("GET", "/v1/models")
    finally:
        await client.aclose()
    assert caught.value.code is ErrorCode.MISSING_CREDENTIAL
    assert server.seen == []


async def test_path_values_are_quoted_so_input_cannot_add_segments(
    client: HermesClient, server: ScriptedServer
) -> None:
    server.script("/api/sessions/a%2F..%2Fjobs", Reply(body=b"{}"))
    await client.request_json("GET", "/api/sessions/{session_id}", {"session_id": "a/../jobs"})
    assert [seen.path for seen in server.seen] == ["/api/sessions/a%2F..%2Fjobs"]


@pytest.mark.aip_family("schema_enforcement", assertions=["invalid_output_rejected"])
async def test_a_2xx_body_that_is_not_json_is_a_transport_failure(
    client: HermesClient, server: ScriptedServer
) -> None:
    server.script("/v1/models", Reply(body=b"<html>oops</html>"))
    with pytest.raises(ConnectorError) as caught:
        await client.request_json("GET", "/v1/models")
    assert caught.value.code is ErrorCode.TRANSPORT


async def test_an_over_size_body_is_refused_while_it_streams(
    client: HermesClient, server: ScriptedServer
) -> None:
    piece = b" " * (1024 * 1024)
    server.script("/v1/models", Reply(body=[piece] * (MAX_JSON_BODY_BYTES // len(piece) + 2)))
    with pytest.raises(ConnectorError) as caught:
        await client.request_json("GET", "/v1/models")
    assert caught.value.code is ErrorCode.TRANSPORT


async def test_refused_connection_is_a_transport_failure(transport: Transport) -> None:
    client = make_client("http://127.0.0.1:9", transport)
    try:
        with pytest.raises(ConnectorError) as caught:
            await client.request_json("GET", "/v1/models")
    finally:
        await client.aclose()
    assert caught.value.code is ErrorCode.TRANSPORT


async def test_the_deadline_ends_a_slow_request_as_deadline_exceeded(
    client: HermesClient, server: ScriptedServer
) -> None:
    server.script("/v1/models", Reply(body=b"{}", delay_s=2.0))
    with pytest.raises(ConnectorError) as caught:
        await client.request_json("GET", "/v1/models", total_timeout_s=0.2)
    assert caught.value.code is ErrorCode.DEADLINE_EXCEEDED


def test_the_read_timeout_outlasts_hermes_keepalive(server: ScriptedServer) -> None:
    client = make_client(server.url, "httpx")
    assert client.timeout.read is not None
    assert client.timeout.read > 30.0


async def test_a_stream_that_answers_json_is_refused(
    client: HermesClient, server: ScriptedServer
) -> None:
    server.script("/v1/chat/completions", Reply(body=b'{"id": "x"}'))
    with pytest.raises(ConnectorError) as caught:
        async with client.stream_sse("POST", "/v1/chat/completions", json_body={}):
            pass
    assert caught.value.code is ErrorCode.TRANSPORT


async def test_stream_errors_before_the_first_event_keep_the_status(
    client: HermesClient, server: ScriptedServer
) -> None:
    server.script("/v1/runs/run_1/events", Reply(status=404, body=PROVIDER_BODY))
    with pytest.raises(ConnectorError) as caught:
        async with client.stream_sse("GET", "/v1/runs/run_1/events"):
            pass
    assert (caught.value.code, caught.value.remote_status) == (ErrorCode.REMOTE_REJECTED, 404)


async def test_stream_bounds_surface_as_typed_errors(
    client: HermesClient, server: ScriptedServer
) -> None:
    from worker.hermes.sse import SSELimits

    flood = sse(*['data: {"event": "message.delta", "delta": "x"}\n\n'] * 10)
    server.script("/flood", Reply(headers=SSE_HEADERS, body=[flood]))
    server.script("/huge", Reply(headers=SSE_HEADERS, body=[b"data: " + b"x" * 5000 + b"\n\n"]))
    limits = SSELimits(max_frame_bytes=1024, max_events=5)

    async def drain(path: str) -> None:
        async with client.stream_sse("GET", path, limits=limits) as stream:
            async for _ in stream:
                pass

    with pytest.raises(ConnectorError) as flooded:
        await drain("/flood")
    with pytest.raises(ConnectorError) as oversized:
        await drain("/huge")
    assert flooded.value.code is ErrorCode.STREAM_TRUNCATED
    assert oversized.value.code is ErrorCode.TRANSPORT


async def test_a_stream_left_early_does_not_wait_for_the_server(
    client: HermesClient, server: ScriptedServer
) -> None:
    body = sse('data: {"event": "run.completed"}\n\n')
    server.script("/v1/runs/run_1/events", Reply(headers=SSE_HEADERS, body=[body], linger_s=30))
    async with asyncio.timeout(5):
        async with client.stream_sse("GET", "/v1/runs/run_1/events") as stream:
            async for event in stream.events():
                assert event.name == "run.completed"
                break


async def test_a_stream_closed_early_closes_its_parser_at_once(
    client: HermesClient, server: ScriptedServer
) -> None:
    """The operator closes the events at a run's terminal event, before the stream ends:
    the parser underneath is closed there, not left for the event loop's async-generator
    finalizer, which would start one more task per Action to close it."""
    body = sse('data: {"event": "run.completed"}\n\n')
    server.script("/v1/runs/run_1/events", Reply(headers=SSE_HEADERS, body=[body], linger_s=30))
    loop = asyncio.get_running_loop()
    started: list[str] = []

    def counting_factory(
        loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Task[Any]:
        started.append(type(coro).__name__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    previous = loop.get_task_factory()
    loop.set_task_factory(counting_factory)
    try:
        async with (
            asyncio.timeout(5),
            client.stream_sse("GET", "/v1/runs/run_1/events") as stream,
            contextlib.aclosing(stream.events()) as events,
        ):
            async for event in events:
                assert event.name == "run.completed"
                break
        gc.collect()
        for _ in range(3):
            await asyncio.sleep(0)
    finally:
        loop.set_task_factory(previous)
    assert "async_generator_athrow" not in started


# --- the key never shows -------------------------------------------------------------------


async def _failures(client: HermesClient, server: ScriptedServer) -> list[ConnectorError]:
    server.script("/e500", Reply(status=500, body=PROVIDER_BODY))
    server.script("/e401", Reply(status=401, body=PROVIDER_BODY))
    server.script(
        "/redir", Reply(status=307, headers={"Location": "http://127.0.0.2:9/x"}, body=b"")
    )
    server.script("/notjson", Reply(body=b"not json " + API_KEY.encode()))
    server.script("/badsse", Reply(headers=SSE_HEADERS, body=[b"data: {not json\n\n"]))
    failures: list[ConnectorError] = []
    for path in ("/e500", "/e401", "/redir", "/notjson"):
        try:
            await client.request_json("POST", path, json_body={"input": "x"})
        except ConnectorError as exc:
            failures.append(exc)
    try:
        async with client.stream_sse("GET", "/badsse") as stream:
            async for _ in stream:
                pass
    except ConnectorError as exc:
        failures.append(exc)
    dead = make_client("http://127.0.0.1:9", client.transport_name)
    try:
        await dead.request_json("GET", "/v1/models")
    except ConnectorError as exc:
        failures.append(exc)
    finally:
        await dead.aclose()
    return failures


@pytest.mark.aip_family("identity_credentials", assertions=["credential_handle_opaque"])
@pytest.mark.aip_family("errors_uncertain_outcomes", assertions=["error_secrets_redacted"])
async def test_the_key_never_appears_in_errors_tracebacks_reprs_or_logs(
    client: HermesClient, server: ScriptedServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    failures = await _failures(client, server)
    assert len(failures) == 6
    texts = [repr(client), repr(client.endpoint), str(client.endpoint)]
    for exc in failures:
        texts += [str(exc), repr(exc), exc.message, "".join(traceback.format_exception(exc))]
        protocol = exc.to_protocol(endpoint_id="hermes-1", read_only=False)
        texts.append(msgspec.json.encode(protocol).decode())
        assert exc.__context__ is None
        assert exc.__cause__ is None
    texts += [record.getMessage() for record in caplog.records]
    texts += [str(record.args) for record in caplog.records]
    blob = "\n".join(texts)
    assert API_KEY not in blob
    assert "MUST-NOT-LEAK" not in blob
    assert "PROVIDER-BODY-MARKER" not in blob
