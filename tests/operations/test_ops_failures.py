"""Failure semantics by operation safety (troubleshooting "Interpret provider failures").

Reads retry temporary and transport failures within the policy and the deadline; unsafe
operations make exactly one attempt, and their 5xx/transport/deadline failures are
`uncertain_outcome: true, retryable: false`, while Hermes' refusals before anything started
(429, 503 `gateway_draining`) are certain and retryable. Streams end typed: truncated, incomplete or
undecodable. These need the fake's fault injection.
"""

from __future__ import annotations

import asyncio

import pytest
from ops_harness import HermesServer, Invoke, endpoint_for

from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.hermes.http_client import HermesClient
from worker.hermes.sse import SSELimits
from worker.operations.registry import default_registry
from worker.testing.fake_hermes import (
    EventsDisconnect,
    EventsFlood,
    EventsMalformed,
    EventsNoise,
    EventsOversize,
    RouteDelay,
    RouteDraining,
    RouteError,
    RouteRedirect,
    StartDrop,
    StartHang,
    StartServerError,
)
from worker.testing.scenario import HELD_REPLY

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def fake(hermes: HermesServer):  # type: ignore[no-untyped-def]
    server = hermes.require_fake()
    server.reset()
    yield server
    server.reset()


async def test_a_read_rides_out_one_temporary_failure(invoke: Invoke, fake) -> None:  # type: ignore[no-untyped-def]
    fake.faults.add(RouteError(route="GET /v1/models", status=503, times=1))
    result = await invoke("models", {})
    assert result.status is ResultStatus.COMPLETED
    assert fake.stats().count("GET /v1/models") == 2


@pytest.mark.aip_family("retry_exhaustion", assertions=["retryable_error_preserved"])
@pytest.mark.aip_family("errors_uncertain_outcomes", assertions=["protocol_fields_preserved"])
async def test_a_read_gives_up_after_the_policy_and_stays_retryable(invoke: Invoke, fake) -> None:  # type: ignore[no-untyped-def]
    fake.faults.add(RouteError(route="GET /v1/skills", status=500, times=None))
    result = await invoke("skills", {})
    assert result.error_code() == ErrorCode.REMOTE_TEMPORARY
    error = result.protocol_error()
    assert (error.retryable, error.uncertain_outcome, error.remote_status) == (True, False, 500)
    assert fake.stats().count("GET /v1/skills") == 3  # one try + hermes_read_retry_attempts


async def test_a_rejected_read_is_not_retried(invoke: Invoke, fake) -> None:  # type: ignore[no-untyped-def]
    result = await invoke("run_status", {"run_id": "run_" + "0" * 32})
    assert result.error_code() == ErrorCode.REMOTE_REJECTED
    assert fake.stats().count("GET /v1/runs/{run_id}") == 1


@pytest.mark.parametrize("status", [500, 503])
@pytest.mark.aip_family("errors_uncertain_outcomes", assertions=["uncertain_outcome_reconciled"])
async def test_unsafe_temporary_failure_is_uncertain_and_never_retried(
    invoke: Invoke,
    fake,
    status: int,  # type: ignore[no-untyped-def]
) -> None:
    fake.faults.add(RouteError(route="POST /api/sessions", status=status, times=None))
    result = await invoke("session_create", {})
    assert result.error_code() == ErrorCode.REMOTE_TEMPORARY
    error = result.protocol_error()
    assert (error.uncertain_outcome, error.retryable, error.remote_status) == (True, False, status)
    assert fake.stats().count("POST /api/sessions") == 1


async def test_an_unsafe_call_hermes_refused_with_429_is_certain_and_retryable(
    invoke: Invoke, fake  # type: ignore[no-untyped-def]
) -> None:
    # Hermes checks its run cap before it creates anything: nothing happened, so the
    # runtime may send it again (the worker itself still makes one attempt).
    fake.faults.add(RouteError(route="POST /v1/chat/completions", status=429, times=None))
    messages = [{"role": "user", "content": "hi"}]
    for name in ("chat", "chat_stream"):  # a JSON reply and an event stream refused alike
        result = await invoke(name, {"messages": messages})
        assert result.error_code() == ErrorCode.REMOTE_TEMPORARY
        error = result.protocol_error()
        assert (error.uncertain_outcome, error.retryable, error.remote_status) == (
            False, True, 429,
        )  # fmt: skip
    assert fake.stats().count("POST /v1/chat/completions") == 2


@pytest.mark.aip_family("retry_exhaustion", assertions=["retryable_error_preserved"])
async def test_hermes_own_run_cap_refusal_of_a_start_is_certain_and_retryable(
    invoke: Invoke,
) -> None:
    """The 429 Hermes itself answers (fake and real) when its open runs are at the cap."""
    run_ids: list[str] = []
    refused = None

    async def start(i: int) -> None:
        nonlocal refused
        started = await invoke("run_start", {"input": f"{i} {HELD_REPLY}"})
        if started.status is ResultStatus.COMPLETED:
            run_ids.append(started.output["run_id"])
        else:
            refused = started

    try:
        # Ten held runs (a minute each) fill the cap; a few more single starts are allowed
        # in case one of the ten did not start.
        await asyncio.gather(*(start(i) for i in range(10)))
        for i in range(10, 30):
            if refused is not None:
                break
            await start(i)
        assert refused is not None
        error = refused.protocol_error()
        assert (error.code, error.remote_status) == (ErrorCode.REMOTE_TEMPORARY, 429)
        assert (error.uncertain_outcome, error.retryable) == (False, True)
    finally:
        for run_id in run_ids:
            await invoke("run_stop", {"run_id": run_id})
        for run_id in run_ids:
            for _ in range(100):
                status = (await invoke("run_status", {"run_id": run_id})).output["status"]
                if status in ("cancelled", "completed", "failed"):
                    break
                await asyncio.sleep(0.1)


async def test_a_draining_gateway_refusal_is_certain_any_other_503_is_not(
    invoke: Invoke, fake  # type: ignore[no-untyped-def]
) -> None:
    fake.faults.add(RouteDraining(route="POST /v1/runs"))
    drained = await invoke("run_start", {"input": "drained"})
    error = drained.protocol_error()
    assert (error.code, error.uncertain_outcome, error.retryable) == (
        ErrorCode.REMOTE_TEMPORARY, False, True,
    )  # fmt: skip
    assert error.remote_status == 503
    fake.faults.add(RouteError(route="POST /v1/runs", status=503))
    failed = await invoke("run_start", {"input": "crashed"})
    other = failed.protocol_error()
    assert (other.uncertain_outcome, other.retryable) == (True, False)
    assert fake.stats().count("POST /v1/runs") == 2


async def test_unsafe_start_lost_after_acceptance_is_uncertain(invoke: Invoke, fake) -> None:  # type: ignore[no-untyped-def]
    fake.faults.add(StartDrop(input_contains="drop-me"), StartServerError(input_contains="500-me"))
    for text, code in (("drop-me", ErrorCode.TRANSPORT), ("500-me", ErrorCode.REMOTE_TEMPORARY)):
        result = await invoke("run_start", {"input": text})
        assert result.error_code() == code
        error = result.protocol_error()
        assert (error.uncertain_outcome, error.retryable) == (True, False)
    assert fake.stats().count("POST /v1/runs") == 2


async def test_unsafe_deadline_is_uncertain_read_deadline_is_retryable(
    invoke: Invoke,
    fake,  # type: ignore[no-untyped-def]
) -> None:
    fake.faults.add(StartHang(input_contains="hang-me"))
    fake.faults.add(RouteDelay(route="GET /v1/toolsets", delay_s=3.0, times=None))
    start = await invoke("run_start", {"input": "hang-me"}, deadline_s=0.5)
    assert start.error_code() == ErrorCode.DEADLINE_EXCEEDED
    assert (start.protocol_error().uncertain_outcome, start.protocol_error().retryable) == (
        True,
        False,
    )
    read = await invoke("toolsets", {}, deadline_s=0.5)
    assert read.error_code() == ErrorCode.DEADLINE_EXCEEDED
    assert (read.protocol_error().uncertain_outcome, read.protocol_error().retryable) == (
        False,
        True,
    )


async def test_a_redirect_is_rejected_with_its_status(invoke: Invoke, fake) -> None:  # type: ignore[no-untyped-def]
    fake.faults.add(RouteRedirect(route="GET /v1/capabilities", status=302))
    result = await invoke("capabilities", {})
    assert result.error_code() == ErrorCode.REMOTE_REJECTED
    assert result.protocol_error().remote_status == 302
    assert fake.stats().count("GET /v1/capabilities") == 1


async def _run_id(invoke: Invoke, text: str) -> str:
    started = await invoke("run_start", {"input": text})
    run_id: str = started.output["run_id"]
    return run_id


async def test_a_cut_event_stream_is_incomplete_not_success(invoke: Invoke, fake) -> None:  # type: ignore[no-untyped-def]
    run_id = await _run_id(invoke, "cut me")
    fake.faults.add(EventsDisconnect(run_id=run_id, after=1))
    result = await invoke("run_events", {"run_id": run_id})
    assert result.error_code() == ErrorCode.STREAM_INCOMPLETE
    assert len(result.ctx.chunks) == 1


@pytest.mark.aip_family("streaming_backpressure", assertions=["bounded_backpressure"])
async def test_the_event_limit_truncates_the_stream(
    invoke: Invoke,
    fake,
    hermes_client: HermesClient,  # type: ignore[no-untyped-def]
) -> None:
    small = default_registry(limits=SSELimits(max_events=50))
    run_id = await _run_id(invoke, "flood me")
    fake.faults.add(EventsFlood(run_id=run_id, count=500))
    result = await invoke("run_events", {"run_id": run_id}, operation=small.get("run_events"))
    assert result.error_code() == ErrorCode.STREAM_TRUNCATED
    assert len(result.ctx.chunks) == 50


@pytest.mark.parametrize(
    "fault", [EventsMalformed(after=1), EventsOversize(after=1)], ids=["malformed", "oversize"]
)
async def test_an_undecodable_frame_is_a_transport_failure(
    invoke: Invoke,
    fake,
    fault,  # type: ignore[no-untyped-def]
) -> None:
    import msgspec

    run_id = await _run_id(invoke, "garble me")
    fake.faults.add(msgspec.structs.replace(fault, run_id=run_id))
    result = await invoke("run_events", {"run_id": run_id})
    assert result.error_code() == ErrorCode.TRANSPORT
    assert len(result.ctx.chunks) == 1


@pytest.mark.parametrize("noise", ["blank_lines", "comments"])
async def test_a_stream_of_lines_without_an_event_is_incomplete(
    invoke: Invoke,
    fake,  # type: ignore[no-untyped-def]
    noise: str,
) -> None:
    run_id = await _run_id(invoke, "noise me")
    fake.faults.add(EventsNoise(run_id=run_id, noise=noise))  # type: ignore[arg-type]
    result = await invoke("run_events", {"run_id": run_id})
    assert result.error_code() == ErrorCode.STREAM_INCOMPLETE
    assert "without an event" in result.protocol_error().message
    assert result.ctx.chunks == []


async def test_a_slow_drip_without_an_event_ends_at_the_idle_time_bound(
    invoke: Invoke,
    fake,  # type: ignore[no-untyped-def]
) -> None:
    registry = default_registry(limits=SSELimits(max_idle_s=0.5))
    run_id = await _run_id(invoke, "drip me")
    fake.faults.add(EventsNoise(run_id=run_id, noise="comments", batch=13, pace_s=0.1))
    started = asyncio.get_running_loop().time()
    result = await invoke("run_events", {"run_id": run_id}, operation=registry.get("run_events"))
    assert result.error_code() == ErrorCode.STREAM_INCOMPLETE
    assert "no event for 0.5 s" in result.protocol_error().message
    assert asyncio.get_running_loop().time() - started < 5


async def test_opening_a_read_stream_is_retried_but_its_events_are_not(
    invoke: Invoke,
    fake,  # type: ignore[no-untyped-def]
) -> None:
    run_id = await _run_id(invoke, "retry open")
    fake.faults.add(RouteError(route="GET /v1/runs/{run_id}/events", status=502, times=1))
    result = await invoke("run_events", {"run_id": run_id})
    assert result.status is ResultStatus.COMPLETED
    assert fake.stats().count("GET /v1/runs/{run_id}/events") == 2


@pytest.mark.parametrize("transport", ["h1", "aiohttp", "httpx"])
async def test_every_transport_runs_json_and_stream_operations(
    invoke: Invoke, hermes: HermesServer, transport: str
) -> None:
    client = HermesClient(endpoint_for(hermes.url, hermes.api_key), transport=transport)  # type: ignore[arg-type]
    try:
        started = await invoke("run_start", {"input": "both transports"}, client=client)
        events = await invoke("run_events", {"run_id": started.output["run_id"]}, client=client)
    finally:
        await client.aclose()
    assert events.status is ResultStatus.COMPLETED
