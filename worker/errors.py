"""The one error hierarchy of the worker, and the one mapping from HTTP/transport outcomes.

Inside the worker a failure is a `ConnectorError` carrying its code; when it leaves (in an
ActionResult, a CancelReply or the DLQ) it becomes a `ProtocolError` whose `retryable` and
`uncertain_outcome` come from the code's rule and whether the operation was read-only.
Messages name the route template and status, never a provider body or a secret.
"""

from __future__ import annotations

from schemas.errors import CODE_RULES, ErrorCode, ProtocolError

_MAX_MESSAGE = 512


class ConnectorError(Exception):
    """A typed failure of one Action; `code` decides category, retry and uncertainty."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        remote_status: int | None = None,
        retryable: bool | None = None,
        uncertain_outcome: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message[:_MAX_MESSAGE]
        self.remote_status = remote_status
        self._retryable = retryable
        self._uncertain = uncertain_outcome

    def to_protocol(self, *, endpoint_id: str | None, read_only: bool) -> ProtocolError:
        rule = CODE_RULES[self.code]
        return ProtocolError(
            code=self.code,
            category=rule.category,
            retryable=(
                rule.retryable(read_only=read_only) if self._retryable is None else self._retryable
            ),
            uncertain_outcome=(
                rule.uncertain_outcome(read_only=read_only)
                if self._uncertain is None
                else self._uncertain
            ),
            message=self.message,
            endpoint_id=endpoint_id,
            remote_status=self.remote_status,
        )

    def __repr__(self) -> str:
        return f"ConnectorError({self.code.value}, {self.message!r}, status={self.remote_status})"


def protocol_error(
    code: ErrorCode,
    message: str,
    *,
    endpoint_id: str | None = None,
    read_only: bool = False,
    remote_status: int | None = None,
) -> ProtocolError:
    """Shorthand for an error that never was an exception (refusals, DLQ reasons)."""
    return ConnectorError(code, message, remote_status=remote_status).to_protocol(
        endpoint_id=endpoint_id, read_only=read_only
    )


#: The `error.code`s of a Hermes 503 that is refused before any work began: a draining
#: gateway answers every agent route with it (shared/reference/hermes-0.19-more.md).
NOT_STARTED_503_CODES = frozenset({"gateway_draining"})


def refused_before_start(status: int, error_code: str | None = None) -> bool:
    """Whether Hermes documents this refusal as made before it started anything: its
    concurrent-run cap (429, checked before a run or turn is created) and a draining
    gateway (503 `gateway_draining`). Repeating such a call cannot duplicate an effect."""
    return status == 429 or (status == 503 and error_code in NOT_STARTED_503_CODES)


def from_http_status(status: int, what: str, *, error_code: str | None = None) -> ConnectorError:
    """The troubleshooting table: 401/403 auth, 429/5xx temporary, any other non-2xx rejected.

    `what` is the method and route template (`POST /v1/runs`), never a concrete URL with ids
    that could carry input, and never the response body. `error_code` is the body's
    `error.code` only, read to recognise a refusal made before anything started: that one is
    certain and retryable even on an unsafe call (a 5xx in general stays uncertain there).
    """
    if refused_before_start(status, error_code):
        return ConnectorError(
            ErrorCode.REMOTE_TEMPORARY,
            f"{what} answered HTTP {status}: refused before anything was started",
            remote_status=status,
            retryable=True,
            uncertain_outcome=False,
        )
    if status in (401, 403):
        code = ErrorCode.AUTHENTICATION
    elif 500 <= status <= 599:
        code = ErrorCode.REMOTE_TEMPORARY
    else:
        code = ErrorCode.REMOTE_REJECTED
    return ConnectorError(code, f"{what} answered HTTP {status}", remote_status=status)


def from_transport(exc: BaseException, what: str) -> ConnectorError:
    """Request, body or SSE decode failure: the exception's class name only, no details."""
    return ConnectorError(ErrorCode.TRANSPORT, f"{what} failed: {type(exc).__name__}")


def deadline_exceeded(what: str) -> ConnectorError:
    return ConnectorError(ErrorCode.DEADLINE_EXCEEDED, f"{what} passed the Action's deadline")


def unexpected_failure(what: str, exc: BaseException) -> ConnectorError:
    """`connector_host.execution`: an execution ended by an exception no typed path expected.

    Only the exception's class name is kept (its text may quote input or a provider body);
    the rule makes it uncertain for unsafe operations, whose request may already be out.
    """
    return ConnectorError(
        ErrorCode.HOST_EXECUTION,
        f"{what} failed unexpectedly ({type(exc).__name__}); read the durable Action and "
        "the worker log before deciding",
    )
