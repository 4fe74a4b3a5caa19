"""The operator's Hermes calls, each answered as a typed outcome instead of an exception.

The operator's decisions are asymmetric on purpose (spec "Fence provider start"): a 4xx is
proof nothing was accepted, while a 5xx, a transport failure or a 2xx without `run_id` leave
the provider state unknown. Returning sum types makes every caller handle every case.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from schemas.errors import ErrorCode
from worker.bus.audit import POLLED_ROUTES, polled
from worker.errors import ConnectorError, EventStreamUnavailable
from worker.hermes.exchange import Answer, Exchange
from worker.hermes.http_client import HermesClient, error_code_of
from worker.hermes.sse import SSEEvent, SSELimits

START_ROUTE = "/v1/runs"
STATUS_ROUTE = "/v1/runs/{run_id}"
#: Read every poll interval: receipted on a change only (`worker.bus.audit.polled`).
assert STATUS_ROUTE in POLLED_ROUTES
EVENTS_ROUTE = "/v1/runs/{run_id}/events"
APPROVAL_ROUTE = "/v1/runs/{run_id}/approval"
STOP_ROUTE = "/v1/runs/{run_id}/stop"

#: A start reply is a tiny JSON object; anything larger is not one.
MAX_START_REPLY_BYTES = 65_536
#: An approval or stop reply is as small.
MAX_COMMAND_REPLY_BYTES = 65_536
MAX_RUN_ID_CHARS = 256
#: What a 429 without `Retry-After` waits (docs/architecture.md §7).
DEFAULT_RETRY_AFTER_S = 1.0
MAX_RETRY_AFTER_S = 60.0

_json = msgspec.json.Decoder()


# --- start ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartAccepted:
    run_id: str


@dataclass(frozen=True, slots=True)
class StartRejected:
    """A 4xx: on a first send, the run was rejected before acceptance."""

    status: int
    #: The body's `error.code` (e.g. `idempotency_key_conflict`), nothing else of it.
    code: str | None = None


@dataclass(frozen=True, slots=True)
class StartRateLimited:
    """Nothing was created, so a later retry is safe: a 429 (Hermes refuses before creating
    anything), or a request that provably never left this process (no connection)."""

    retry_after_s: float
    #: How the attempt ended, for the message when the deadline stops the retries.
    why: str = "kept answering 429"


#: Wait before another attempt when the request could not be sent at all.
NOT_SENT_RETRY_S = 0.5


@dataclass(frozen=True, slots=True)
class StartUnknown:
    """The run may or may not exist: never retried, never replayed."""

    reason: str
    remote_status: int | None = None


StartOutcome = StartAccepted | StartRejected | StartRateLimited | StartUnknown


async def start_run(
    hermes: HermesClient, body: bytes, headers: Mapping[str, str], timeout_s: float
) -> StartOutcome:
    """`POST /v1/runs` once, its answer mapped by `START_OUTCOMES`. Cancellation propagates
    (the caller's lease is gone)."""
    exchange = await hermes.exchange(
        "POST",
        START_ROUTE,
        body,
        headers,
        timeout_s=timeout_s,
        max_body_bytes=MAX_START_REPLY_BYTES,
    )
    return START_OUTCOMES[exchange.answer](exchange)


def _accepted(exchange: Exchange) -> StartOutcome:
    run_id = _run_id(exchange.body)
    if run_id is None:
        return StartUnknown(
            f"POST /v1/runs answered HTTP {exchange.status} without a run_id", exchange.status
        )
    return StartAccepted(run_id)


def _rejected(exchange: Exchange) -> StartOutcome:
    assert exchange.status is not None
    body = exchange.body
    return StartRejected(exchange.status, None if body is None else error_code_of(body))


def _unknown(exchange: Exchange) -> StartOutcome:
    return StartUnknown(f"POST /v1/runs answered HTTP {exchange.status}", exchange.status)


def _refused(exchange: Exchange) -> StartOutcome:
    """The run cap (429) or a draining gateway (503 `gateway_draining`): nothing exists."""
    return StartRateLimited(
        _retry_after(exchange.headers.get("Retry-After")), f"kept answering {exchange.status}"
    )


#: How a start's answer maps to its outcome (spec "Fence provider start"): a 4xx proves
#: nothing was accepted; a 5xx, a transport failure after a connection existed, a timeout or a
#: 2xx without `run_id` leave the run unknown; only a refusal made before anything started,
#: or a request that never left this process, may be repeated. Every `Answer` has a row.
START_OUTCOMES: Mapping[Answer, Callable[[Exchange], StartOutcome]] = {
    Answer.OK: _accepted,
    Answer.REFUSED_BEFORE_START: _refused,
    Answer.AUTH: _rejected,
    Answer.CLIENT_ERROR: _rejected,
    Answer.SERVER_ERROR: _unknown,
    Answer.UNEXPECTED: _unknown,
    Answer.NOT_SENT: lambda _: StartRateLimited(
        NOT_SENT_RETRY_S, "could not be sent (no connection)"
    ),
    Answer.LOST: lambda exchange: StartUnknown(
        f"POST /v1/runs failed in transport: {exchange.failure}"
    ),
    Answer.TIMED_OUT: lambda _: StartUnknown(
        "POST /v1/runs did not answer before the start claim budget"
    ),
}


def _run_id(raw: bytes | None) -> str | None:
    if raw is None or len(raw) > MAX_START_REPLY_BYTES:
        return None
    try:
        body = _json.decode(raw)
    except msgspec.DecodeError:
        return None
    run_id = body.get("run_id") if isinstance(body, dict) else None
    if isinstance(run_id, str) and run_id.strip() and len(run_id) <= MAX_RUN_ID_CHARS:
        return run_id
    return None


def _retry_after(value: str | None) -> float:
    if value is None:
        return DEFAULT_RETRY_AFTER_S
    try:
        seconds = float(value)
    except ValueError:
        return DEFAULT_RETRY_AFTER_S
    if seconds != seconds or seconds < 0:  # NaN or negative
        return DEFAULT_RETRY_AFTER_S
    return min(seconds, MAX_RETRY_AFTER_S)


# --- status --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatusRead:
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunGone:
    """404: Hermes forgot the run (restart or retention). Not proof of no effect."""


@dataclass(frozen=True, slots=True)
class ReadFailed:
    """No usable answer; `transient` failures (429, 5xx, transport) are worth another poll."""

    error: ConnectorError
    transient: bool


StatusOutcome = StatusRead | RunGone | ReadFailed


async def read_status(
    hermes: HermesClient, run_id: str, headers: Mapping[str, str], timeout_s: float
) -> StatusOutcome:
    """One read of the run's status; receipted (`polled`) only when it read something else
    than the read before it for this Action."""
    started = time.monotonic()
    outcome = await _read_status(hermes, run_id, headers, timeout_s)
    status: int | None = 200
    state: str | None = None
    match outcome:
        case StatusRead(body=body):
            raw = body.get("status")
            state = raw[:64] if isinstance(raw, str) else None
        case RunGone():
            status = 404
        case ReadFailed(error=error):
            status = error.remote_status
            state = error.code.value
    polled(
        STATUS_ROUTE, method="GET", status=status, state=state,
        duration_ms=(time.monotonic() - started) * 1000,
    )
    return outcome


async def _read_status(
    hermes: HermesClient, run_id: str, headers: Mapping[str, str], timeout_s: float
) -> StatusOutcome:
    try:
        response = await hermes.request_json(
            "GET",
            STATUS_ROUTE,
            {"run_id": run_id},
            headers=headers,
            total_timeout_s=max(0.1, timeout_s),
        )
    except ConnectorError as exc:
        status = exc.remote_status
        if status == 404:
            return RunGone()
        transient = status is None or status == 429 or status >= 500
        return ReadFailed(exc, transient)
    if not isinstance(response.body, dict):
        error = ConnectorError(ErrorCode.TRANSPORT, f"GET {STATUS_ROUTE} answered a non-object")
        return ReadFailed(error, True)
    return StatusRead(response.body)


# --- approval and stop ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommandApplied:
    body: Any


@dataclass(frozen=True, slots=True)
class CommandRejected:
    """A definitive 4xx: Hermes did not apply the command."""

    status: int
    #: The body's `error.code` (`run_not_active`, `approval_not_pending`, …), nothing else.
    code: str | None = None


@dataclass(frozen=True, slots=True)
class CommandUnknown:
    """5xx or transport failure: Hermes may have applied it."""

    reason: str
    remote_status: int | None = None


CommandOutcome = CommandApplied | CommandRejected | CommandUnknown

#: Hermes (after 0.19) answers a command on a finished run 409 with this `error.code`.
RUN_NOT_ACTIVE = "run_not_active"


async def _command(
    hermes: HermesClient,
    route: str,
    run_id: str,
    body: dict[str, Any],
    headers: Mapping[str, str],
    timeout_s: float,
) -> CommandOutcome:
    """One command, sent once: only a 4xx is proof it was not applied."""
    exchange = await hermes.exchange(
        "POST",
        route,
        msgspec.json.encode(body),
        headers,
        timeout_s=max(0.1, timeout_s),
        max_body_bytes=MAX_COMMAND_REPLY_BYTES,
        params={"run_id": run_id},
    )
    status = exchange.status
    raw = exchange.body
    if exchange.answer is Answer.OK and status is not None:
        try:
            return CommandApplied(_json.decode(raw) if raw and raw.strip() else None)
        except msgspec.DecodeError:
            return CommandUnknown(f"POST {route} answered a body that is not JSON", status)
    if status is not None and 400 <= status < 500:
        return CommandRejected(status, None if raw is None else error_code_of(raw))
    if status is not None:
        return CommandUnknown(f"POST {route} answered HTTP {status}", status)
    return CommandUnknown(f"POST {route} failed: {exchange.failure or exchange.answer.value}")


async def send_approval(
    hermes: HermesClient,
    run_id: str,
    choice: str,
    resolve_all: bool,
    headers: Mapping[str, str],
    timeout_s: float,
    *,
    request_id: str | None = None,
) -> CommandOutcome:
    """The decision, naming the exact prompt by `request_id` when Hermes gave it one (after
    0.19); without it Hermes answers its oldest pending prompt, as 0.19 does."""
    body: dict[str, Any] = {"choice": choice}
    if resolve_all:
        body["all"] = True
    if request_id is not None:
        body["request_id"] = request_id
    return await _command(hermes, APPROVAL_ROUTE, run_id, body, headers, timeout_s)


async def send_stop(
    hermes: HermesClient, run_id: str, headers: Mapping[str, str], timeout_s: float
) -> CommandOutcome:
    return await _command(hermes, STOP_ROUTE, run_id, {}, headers, timeout_s)


# --- events --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def open_events(
    hermes: HermesClient, run_id: str, headers: Mapping[str, str], limits: SSELimits
) -> AsyncIterator[AsyncIterator[SSEEvent]]:
    """The run's event stream, bounded by `limits` (frame bytes, event count), opened along
    the client's one SSE path (`HermesClient.stream_sse`, as the raw `runs` capability).

    A failure to open it (404, another status, no event stream, transport) is
    `EventStreamUnavailable`: the observer polls instead. Reading yields the stream's own
    typed failures (limit, decode, idle, cut: `SSEStream.events`), which the observer's
    read (`Observer._follow_stream`) turns into `EventStreamUnavailable` in the one place it
    reads, rather than through another generator per held run. An error raised by the
    caller's own block passes unchanged; the connection is closed whatever way the block
    ends.
    """
    opened = False
    try:
        async with hermes.stream_sse(
            "GET", EVENTS_ROUTE, {"run_id": run_id}, headers=headers, limits=limits
        ) as stream:
            opened = True
            events = stream.events()
            try:
                yield events
            finally:
                await events.aclose()
    except ConnectorError as exc:
        if opened:
            raise
        raise EventStreamUnavailable(exc.message) from None
