"""How one exchange with Hermes ended, typed: the table every caller maps from.

`answer_of` sorts an HTTP status (and, for a 503, the body's `error.code`) into an `Answer`;
the client adds the answers of a request that got none (not sent, lost in transport, timed
out). `from_http_status` maps an answer to the `ConnectorError` a route operation raises,
through `ERROR_BY_ANSWER`; the operator's unsafe start maps the same answers to its own
outcomes by its own table (`worker.operator.provider`). `Exchange` is what the client
reports of each finished request to the hook the app wires (metrics, the audit receipt) and
what a one-shot exchange returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from schemas.errors import ErrorCode
from worker.errors import ConnectorError


class Answer(StrEnum):
    """How one request ended."""

    #: 2xx.
    OK = "ok"
    #: Refused before anything was started (429, 503 `gateway_draining`): a repeat cannot
    #: duplicate an effect.
    REFUSED_BEFORE_START = "refused_before_start"
    #: 401 or 403.
    AUTH = "auth"
    #: Any other 4xx: the request was rejected.
    CLIENT_ERROR = "client_error"
    #: Any other 5xx: whatever the request asked may or may not have happened.
    SERVER_ERROR = "server_error"
    #: 1xx or 3xx (redirects are never followed).
    UNEXPECTED = "unexpected"
    #: No connection could be had: the request provably never reached the wire.
    NOT_SENT = "not_sent"
    #: A transport failure once a connection existed: it may have been delivered.
    LOST = "lost"
    #: No answer within the caller's budget.
    TIMED_OUT = "timed_out"


#: The `error.code`s of a Hermes 503 that is refused before any work began: a draining
#: gateway answers every agent route with it (shared/reference/hermes-0.19-more.md).
NOT_STARTED_503_CODES = frozenset({"gateway_draining"})


def refused_before_start(status: int, error_code: str | None = None) -> bool:
    """Whether Hermes documents this refusal as made before it started anything: its
    concurrent-run cap (429, checked before a run or turn is created) and a draining
    gateway (503 `gateway_draining`). Repeating such a call cannot duplicate an effect."""
    return status == 429 or (status == 503 and error_code in NOT_STARTED_503_CODES)


def answer_of(status: int, error_code: str | None = None) -> Answer:
    """The answer an HTTP status is; `error_code` is a 503 body's `error.code` only."""
    if 200 <= status < 300:
        return Answer.OK
    if refused_before_start(status, error_code):
        return Answer.REFUSED_BEFORE_START
    if status in (401, 403):
        return Answer.AUTH
    if 400 <= status < 500:
        return Answer.CLIENT_ERROR
    if 500 <= status < 600:
        return Answer.SERVER_ERROR
    return Answer.UNEXPECTED


#: The troubleshooting table: 401/403 auth, 5xx temporary, any other non-2xx rejected.
ERROR_BY_ANSWER: Mapping[Answer, ErrorCode] = {
    Answer.AUTH: ErrorCode.AUTHENTICATION,
    Answer.CLIENT_ERROR: ErrorCode.REMOTE_REJECTED,
    Answer.SERVER_ERROR: ErrorCode.REMOTE_TEMPORARY,
    Answer.UNEXPECTED: ErrorCode.REMOTE_REJECTED,
}


def from_http_status(status: int, what: str, *, error_code: str | None = None) -> ConnectorError:
    """The ConnectorError of a non-2xx answer (`ERROR_BY_ANSWER`).

    `what` is the method and route template (`POST /v1/runs`), never a concrete URL with ids
    that could carry input, and never the response body. `error_code` is the body's
    `error.code` only, read to recognise a refusal made before anything started: that one is
    certain and retryable even on an unsafe call (a 5xx in general stays uncertain there).
    """
    answer = answer_of(status, error_code)
    if answer is Answer.REFUSED_BEFORE_START:
        return ConnectorError(
            ErrorCode.REMOTE_TEMPORARY,
            f"{what} answered HTTP {status}: refused before anything was started",
            remote_status=status,
            retryable=True,
            uncertain_outcome=False,
        )
    return ConnectorError(
        ERROR_BY_ANSWER.get(answer, ErrorCode.REMOTE_REJECTED),
        f"{what} answered HTTP {status}",
        remote_status=status,
    )


def from_transport(exc: BaseException, what: str) -> ConnectorError:
    """Request, body or SSE decode failure: the exception's class name only, no details."""
    return ConnectorError(ErrorCode.TRANSPORT, f"{what} failed: {type(exc).__name__}")


@dataclass(frozen=True, slots=True)
class Exchange:
    """One finished request to one endpoint: method, route template, how it ended, and how
    long it took; never a concrete URL, a header value or (in a report) a body."""

    endpoint_id: str
    method: str
    route: str
    answer: Answer
    #: The HTTP status (None: no answer).
    status: int | None
    seconds: float
    #: A one-shot exchange's body, read up to the caller's bound (None: larger, not kept).
    body: bytes | None = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    #: For `LOST` and `NOT_SENT`: the transport exception's class name, never its text.
    failure: str | None = None


#: What the app wires into every client to hear of each finished exchange.
ExchangeHook = Callable[[Exchange], None]
