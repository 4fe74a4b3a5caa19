"""Whether JetStream is taking this worker's publishes now: what `/ready` reports.

Why: with the JetStream store full (or JetStream disabled by the server after a write
error) a worker still fetches and runs Actions, but nothing it owes the bus is stored: the
results wait in Redis for the bus to come back (`worker/pipeline/outbox.py`). The NATS
connection stays up throughout, so `/ready` said 200 while every publish failed. The
publisher (`worker/bus/publisher.py`) and the chunk stream (`worker/execution/chunk_stream.py`)
report every publish JetStream refused or left unanswered here, and every one it stored;
`/ready` is 503 while the last outcome is a failure no older than `window_s`, with a reason
naming the failure and what an operator does about it.

A failure older than `window_s` with nothing attempted since stops counting: an idle worker
does not stay unready for good because of one old failure (a worker owing the bus
something retries it on every redelivery, so a lasting outage keeps failing fresh).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

#: How long a publish failure keeps `/ready` at 503 when nothing was attempted since.
FAILURE_WINDOW_S = 30.0

#: JetStream's answers that mean JetStream itself is off on the server (not enabled, or
#: disabled after a store write failed: nats-server then stays so until it restarts).
_JETSTREAM_OFF_CODES = frozenset({10039, 10076})
#: A store-level refusal: no space, a failed write, insufficient resources.
_STORE_CODES = frozenset({10023, 10047, 10077})


@dataclass(frozen=True, slots=True)
class PublishFailure:
    """The last failure: when (monotonic seconds) and what, as a reason line for `/ready`."""

    at: float
    what: str


def describe_failure(exc: BaseException) -> str:
    """One line for an operator: what JetStream answered and what to do about it. Never
    the payload, only the error's type, code and JetStream's own description."""
    code = getattr(exc, "err_code", None)
    description = str(getattr(exc, "description", "") or "")[:200]
    name = type(exc).__name__
    if code in _JETSTREAM_OFF_CODES or name == "NoStreamResponseError":
        return (
            f"JetStream publication failing: JetStream is not answering ({name}"
            f"{f' {code}' if code else ''}{f': {description}' if description else ''}); a "
            "server that ran out of store space disables JetStream until it is restarted: "
            "free space, then restart nats-server (docs/operations.md, 'Full disk')"
        )
    if code in _STORE_CODES:
        return (
            f"JetStream publication failing: the store refused a write ({code}: "
            f"{description or name}); free space under the JetStream store_dir or raise "
            "max_file_store (docs/operations.md, 'Full disk')"
        )
    if isinstance(exc, TimeoutError) or "Timeout" in name:
        return (
            f"JetStream publication failing: no answer in time ({name}); a stream whose "
            "store write failed (a full disk) stops answering publishes, even after space is "
            "freed, until nats-server restarts: free space, then restart nats-server "
            "(docs/operations.md, 'Full disk')"
        )
    return f"JetStream publication failing: {name}{f' {code}' if code else ''}" + (
        f": {description}" if description else ""
    )


class PublishHealth:
    """The last publish outcome this worker saw (see the module docstring)."""

    def __init__(
        self,
        *,
        window_s: float = FAILURE_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._failure: PublishFailure | None = None
        #: Failures seen since the last success (the `/ready` reason says how many).
        self.failures_since_success = 0

    def succeeded(self) -> None:
        """JetStream stored a publish: the bus takes writes again."""
        if self._failure is not None:
            self._failure = None
            self.failures_since_success = 0

    def failed(self, exc: BaseException) -> None:
        """JetStream refused a publish or did not answer it."""
        self._failure = PublishFailure(self._clock(), describe_failure(exc))
        self.failures_since_success += 1

    def reason(self) -> str | None:
        """None while publishes succeed; else the `/ready` reason line."""
        failure = self._failure
        if failure is None or self._clock() - failure.at > self.window_s:
            return None
        return f"{failure.what} ({self.failures_since_success} failed since the last stored)"
