"""Every exception of the runtime and of the programs shipped with it, one root per program.

An Action's failure is a `ConnectorError` carrying its `connector.hermes_agent.*` or
`connector_host.*` code. When it leaves (in an ActionResult, an error Envelope or the DLQ) it
becomes a `ProtocolError` whose `retryable` and `uncertain_outcome` come from the code's rule
(`schemas/errors.py`) and whether the operation was read-only. Every other exception here is
caught in one place and never leaves as itself: it becomes a ConnectorError, a nak (the
message comes back later), a DLQ entry, a command's exit status, or a qualification verdict.
Messages name the route template and status, never a provider body or a secret.

Each line says what a caller may do next. R: retryable (the same work, repeated later, can
succeed); U: uncertain (something may have happened although this was raised).

    Exception
      WorkerError                 the runtime's root
        ConnectorError            R and U from the code's rule and read-only, unless given
          IllegalTransition       `error`: a connector bug. Not R, not U
          PolicyError             `operator_policy`: not R, not U; at start-up, exit 2
        Refusal                   a trusted envelope that may not run: one failed result
                                  with its ConnectorError's code (R and U from that code)
        Rejected                  an envelope not trusted or not readable: dead-lettered
                                  once, never answered on an Action's subjects; not R, not U
        LeaseLost                 the lease may belong to another worker now: stop at once;
                                  nothing is settled, published or acked (the next owner
                                  takes over: R by redelivery; U: what was sent may have run)
        StoreUnavailable          Redis gave no answer in the budget: R (nak). U: a script
                                  may have run; the repeat with the same owner answers it
          StoreNotAccepting       no new lease asked for (gate closed, maxmemory): R, not U
        SlotMoved                 a confirmed write's slot moved before its WAIT: R
                                  (repeated at once), U until the repeat answers
        PublishFailed             JetStream did not confirm: R (nak). U: it may have landed;
                                  the repeat's `Nats-Msg-Id` is dropped by the dedupe window
          StreamFull              the DLQ refuses new entries: not R, not U; counted
        RuntimeRecordsUnreadable  the runtime's records could not be read: R (next poll)
        SSEError                  the SSE decoder stopped; becomes a ConnectorError:
          SSEDecodeError          `transport` (R if read-only, U if unsafe)
          SSELimitReached         `stream_truncated` (not R, U if unsafe)
          SSEIdle                 `stream_incomplete` (not R, U if unsafe)
        EventStreamUnavailable    a run's event stream did not open: the operator polls
        HttpPoolError             the worker's HTTP/1.1 pool (`worker/hermes/h1.py`);
                                  becomes `transport` or a start's answer; U unless one of
                                  `NEVER_SENT`:
          HttpConnectError        no connection could be had: nothing written, not U
          HttpPoolTimeout         every slot taken for the pool timeout: nothing written
          HttpConnectTimeout      no connection within the connect timeout: nothing written
          HttpHeaderRefused       a header holds CR, LF or NUL: nothing written
          HttpDisconnected        the connection ended before the whole answer: U
          HttpReadTimeout         no byte within the read timeout while awaited: U
          HttpProtocolError       the answer is not HTTP/1.1 this client reads: U
        NotAuthorized             no membership covers it: a refusal or an authorization
                                  conflict (not R, not U)
        ApprovalRefused           `approve` wrote nothing: not R as asked, not U; exit 1
        ResolutionRefused         an escalation cannot be resolved so: not R, not U; exit 1
        DlqRefused                a DLQ entry not found, replayed or discarded so: not R,
                                  not U; exit 1
        SettingsError             a setting refused at start-up: exit 2, nothing started
        ServiceUnreachable        NATS or Redis did not answer a command: exit 3, R later
        ChannelMessageRefused     a channel message not published: dead-lettered once
        QueueEntryExists          another writer created the child's entry first: read it
        FaultRaised               a test's fault point: `connector_host.execution` (U if
                                  unsafe); a RuntimeError too
        ConfigRefused             refused at start-up (exit 2), nothing started; not R, not
                                  U; a ValueError too:
          TrustConfigError        a trust file
          SecretFileError         a secret file
          ChannelConfigError      the channel file
          ResponseSigningConfigError  the worker's signing key
      ClientError                 the client's root (`worker/client.py`, the bus commands)
        UnverifiedResponse        `response_signing` (consumer side): not R, not U; read the
                                  durable state instead; CLI exit 4
          CannotSign              the worker had no signing key (same facts)
      GatewayError                the gateway's root (`worker/gateway/`)
        RouteConfigError          the capability routes: exit 2; a ValueError too
        ActionIdTaken             a child's first dispatch was a `duplicate`: another
                                  envelope holds the id; refused like an unknown id, not U
        McpHttpRefused            an MCP server refused the session before any tool ran:
                                  not U; a RuntimeError too
        NativeRefusal             a request on the native NATS binding is answered with an
                                  `aip.core.v1.error`: R and U as the refusal says
        ControlFailed             a connector-control call to the GetAIP central got no
                                  usable answer: the host holds no lease and retries
        NotDelivered              a chunk sink could not deliver a chunk: the follow sends
                                  no later chunk (a gap would mislead); not R, not U
      QualifyError                the qualification's root (`worker/qualify/`)
        QualifyFailed             a qualification item failed: the verdict, no retry
        QualifySkipped            a qualification item cannot run here: the verdict
        QualifyNotConfigured      a setting the item needs is missing: it skips
        UnknownFamily             a conformance tag names a family or assertion id the kit
                                  does not have: the tagged test fails; a ValueError too

The demo's exceptions are under `DemoError` (`worker/demo/`), the test harness's under
`HarnessError` (`worker/testing/_errors.py`), each in its own package.

`schemas/` sits below `worker/` and imports nothing from it, so the two exceptions of the
wire layer live in `schemas/errors.py` beside the code table: `EnvelopeRejected` (a
dead-lettered envelope: not R, not U) and `InvalidEndpointId` (a start-up refusal).
"""

from __future__ import annotations

from typing import Any, Final

from schemas.aip.extensions import RetryExhausted
from schemas.errors import CODE_RULES, ErrorCategory, ErrorCode, ProtocolError

_MAX_MESSAGE = 512

# --- one root per program --------------------------------------------------------------------


class WorkerError(Exception):
    """The root of the runtime's exceptions (the worker process and its commands)."""


class ConfigRefused(WorkerError, ValueError):
    """A file or value the worker refuses at start-up (exit 2, nothing started); a
    ValueError too, as every start-up refusal of a bad value is."""


class ClientError(Exception):
    """The root of the client's exceptions (`worker.client.AipClient`, the CLI's bus
    commands): what a consumer of results and chunks may meet."""


class GatewayError(Exception):
    """The root of the AIP gateway's exceptions (`worker.gateway`)."""


class QualifyError(Exception):
    """The root of the qualification's verdicts (`worker.qualify`)."""


class UnknownFamily(QualifyError, ValueError):
    """A conformance tag names a family or an assertion id the kit does not have
    (worker/conformance/families.py): a typo would otherwise leave a required assertion
    silently unproven."""


# --- an Action's failure -------------------------------------------------------------------


class ConnectorError(WorkerError):
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
        #: Set by the read retry policy when this is the last of the attempts it allowed
        #: (`worker/operations/retry.py`): the settled result carries it, and the Action is
        #: dead-lettered with it (`worker/pipeline/exhausted.py`).
        self.retry_exhausted: RetryExhausted | None = None

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


class IllegalTransition(ConnectorError):
    """A move the operator's transition table forbids: a connector bug, never a provider answer."""

    def __init__(self, what: str) -> None:
        super().__init__(ErrorCode.ERROR, f"illegal operator transition: {what}")


class PolicyError(ConnectorError):
    """An invalid operator policy: the operator refuses to run (`operator_policy`)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.OPERATOR_POLICY, message)


# --- how a delivery ends early (worker/pipeline/) -------------------------------------------


class Refusal(WorkerError):
    """A trusted envelope that may not run: settled once as a failed result (`refuse`)."""

    def __init__(self, error: ConnectorError, *, read_only: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.read_only = read_only


class Rejected(WorkerError):
    """An envelope that is not trusted or not readable: dead-lettered, then `term()`.

    `action_id` is given only for an authenticated envelope (its receipt joins that
    Action's chain); `claimed_action_id` is what an unauthenticated one claims to be (its
    receipt goes under the DLQ entry's own id).
    """

    def __init__(
        self,
        code: ErrorCode,
        reason: str,
        *,
        action_id: str | None = None,
        claimed_action_id: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.action_id = action_id
        self.claimed_action_id = claimed_action_id


class LeaseLost(WorkerError):
    """This worker no longer owns the Action: stop at once, settle nothing, ack nothing.

    The one form a lost lease takes, whoever finds it (worker/execution/leases.py)."""


# --- what an Action depends on: Redis, JetStream, the AIP runtime's records -----------------


class StoreUnavailable(WorkerError):
    """Redis did not answer within the caller's budget; nothing may be decided from it."""


class StoreNotAccepting(StoreUnavailable):
    """No new lease was asked for: Redis is failing or near maxmemory (`StoreHealth`).

    Certain and retryable: nothing was written, so the delivery is nak'd for another worker.
    """


class SlotMoved(WorkerError):
    """A confirmed write's Redis Cluster slot moved between the write and its WAIT; the
    operator store repeats both."""


class PublishFailed(WorkerError):
    """JetStream did not confirm a publish within the budget."""


class StreamFull(PublishFailed):
    """The stream is at its byte or message limit (or the server's store is full)."""


class RuntimeRecordsUnreadable(WorkerError):
    """The AIP runtime's queue or lifecycle record could not be read (NATS reconnecting, a
    timeout): try again, decide nothing."""


# --- Hermes ---------------------------------------------------------------------------------


class SSEError(WorkerError):
    """Base of the SSE decoder's failures; messages never quote stream content."""


class SSEDecodeError(SSEError):
    """A frame over the size bound, or one that is not UTF-8 or not JSON."""


class SSELimitReached(SSEError):
    """The event-count bound ended consumption before the stream did."""


class SSEIdle(SSEError):
    """The stream kept sending bytes (blank lines, comments) but no event, past a bound."""


class EventStreamUnavailable(WorkerError):
    """A run's event stream could not be opened (404, other status, transport): poll instead."""


# --- trust and the operator's commands ------------------------------------------------------


class HttpPoolError(WorkerError):
    """Any failure of the worker's HTTP/1.1 pool; `NEVER_SENT` says when nothing was written."""


class HttpConnectError(HttpPoolError):
    """No connection could be had: nothing of the request was written."""


class HttpPoolTimeout(HttpPoolError):
    """Every connection slot stayed taken for the pool timeout: nothing was written."""


class HttpConnectTimeout(HttpPoolError):
    """No connection within the connect timeout: nothing was written."""


class HttpHeaderRefused(HttpPoolError):
    """A header the request would carry holds CR, LF or NUL: refused, nothing written."""


class HttpDisconnected(HttpPoolError):
    """The connection ended before the whole answer arrived: the request may have run."""


class HttpReadTimeout(HttpPoolError):
    """No byte of the answer for the read timeout while it was awaited: may have run."""


class HttpProtocolError(HttpPoolError):
    """The server's bytes are not an HTTP/1.1 answer this client can read: may have run."""


#: The pool's failures raised before any byte of the request was written.
NEVER_SENT: Final = (HttpConnectError, HttpPoolTimeout, HttpConnectTimeout, HttpHeaderRefused)


class NotAuthorized(WorkerError):
    """The principal holds no live membership covering this tenant and capability."""


class ApprovalRefused(WorkerError):
    """`approve` could not record the decision; the message tells the operator why."""


class ResolutionRefused(WorkerError):
    """The escalation cannot be resolved this way; the message says why."""


class DlqRefused(WorkerError):
    """A DLQ entry that is not there, or cannot be replayed or discarded so (`dlq`
    commands); the message says why."""


class UnverifiedResponse(ClientError):
    """A result, chunk chain, DLQ entry, escalation or receipt that does not verify against
    the trusted worker keys.

    `code` is `connector_host.response_signing`: treat the response as an integrity failure
    and read the Action's durable state instead.
    """

    code = ErrorCode.HOST_RESPONSE_SIGNING


class CannotSign(UnverifiedResponse):
    """An unsigned `connector_host.response_signing` result: the worker had no signing key.

    The spec's answer: an integrity failure; read the Action's state through the gateway.
    """


# --- start-up and the command line ----------------------------------------------------------


class SettingsError(WorkerError):
    """A configuration value was refused; the message names the field(s)."""


class ServiceUnreachable(WorkerError):
    """A service did not answer a command; the message names the URL and the setting."""


class TrustConfigError(ConfigRefused):
    """A trust file that is missing, unsafe or invalid; the message names file and entry."""


class SecretFileError(ConfigRefused):
    """A secret file that is missing, unsafe, empty or too large (the message names why)."""


class ChannelConfigError(ConfigRefused):
    """The channel file is refused; the message names the file and the rule."""


class RouteConfigError(GatewayError, ValueError):
    """A capability route table that cannot be used; the message names the entry."""


class ResponseSigningConfigError(ConfigRefused):
    """The worker signing key cannot be used: the worker refuses to start."""


# --- channels and the gateway ---------------------------------------------------------------


class ChannelMessageRefused(WorkerError):
    """A session message the channel follower does not publish (dead-lettered, counted)."""


class QueueEntryExists(WorkerError):
    """The child's queue entry was created by someone else first."""


class ActionIdTaken(GatewayError):
    """The child's first dispatch was acknowledged `duplicate`: another publisher's envelope
    holds the id on the actions stream, so nothing that runs under it is this child."""


class ControlFailed(GatewayError):
    """A connector-control call (register, heartbeat, drain, offline) got no usable answer:
    unreachable, unsigned or rejected. The host holds no lease until a later call succeeds
    (worker/gateway/connector_control.py)."""


class NotDelivered(GatewayError):
    """A chunk sink could not deliver a chunk (worker/gateway/chunk_follower.py): the
    stream to that sink ends there; the Action's result is answered as usual."""


class NativeRefusal(GatewayError):
    """A request the binding answers with an `aip.core.v1.error` Envelope: the reference
    gateway's code (aip-1.0-wire.md §2.6), its category and whether a retry may help."""

    def __init__(
        self,
        code: str,
        message: str,
        category: ErrorCategory = ErrorCategory.AUTH,
        *,
        retryable: bool = False,
        retry_after_ms: int | None = None,
        uncertain: bool = False,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.category = category
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms
        self.uncertain = uncertain

    def to_aip(self) -> dict[str, Any]:
        """The ProtocolError of the answer (AIP serialized form)."""
        error: dict[str, Any] = {
            "code": self.code,
            "message": self.message[:1024],
            "category": self.category.value,
            "retryable": self.retryable,
            "details": {"uncertain_outcome": self.uncertain},
            "source": {"component": "aip-hermes-worker-gateway", "binding": "aip.native.nats.v1"},
        }
        if self.retry_after_ms is not None:
            error["retry_after_ms"] = self.retry_after_ms
        return error


class McpHttpRefused(GatewayError, RuntimeError):
    """The MCP server refused the session (HTTP status) before any tool ran."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the MCP server answered HTTP {status}")
        self.status = status


# --- tests and qualification ----------------------------------------------------------------


class FaultRaised(WorkerError, RuntimeError):
    """What a fault point's `raise` action raises: an exception no code path expected."""


class QualifyFailed(QualifyError):
    """The deployment did something the spec does not allow; the message says what."""


class QualifySkipped(QualifyError):
    """The qualification item cannot run against this deployment; the message says why."""


class QualifyNotConfigured(QualifyError):
    """A setting this qualification step needs is missing; the item skips with this message."""


# --- shorthands -----------------------------------------------------------------------------


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


def attempted_before(*, refused: ErrorCode | None = None) -> ConnectorError:
    """An unsafe request an earlier owner of the Action recorded it was about to send
    (`attempted_fence`): it may have reached Hermes, so the outcome is unknown and nothing
    is sent again -- whether this delivery would have executed or was refused (`refused`,
    the refusal's own code: a replay past the window, say), never a certain failure.
    """
    because = f" (this delivery was refused: {refused.value})" if refused is not None else ""
    return ConnectorError(
        ErrorCode.TRANSPORT,
        "an earlier worker may have sent this request before it stopped; the outcome is "
        f"unknown and it is not sent again{because}",
        retryable=False,
        uncertain_outcome=True,
    )
