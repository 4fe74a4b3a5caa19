"""The replay boundary: an envelope runs only if it was stored young, and while its state lasts.

A signed envelope stays valid as bytes forever; what stops it from running twice is the
state its first delivery left in Redis (the lease with its request fingerprint, the stored
result, the operator binding), and that state expires. Two comparisons decide, both
`connector_host.replay` when they fail, right after the signature and before identity,
approval or any provider request (troubleshooting, "Diagnose trust and routing in order"):

1. **Stored young.** `created_at_unix_ms` (C) against the time JetStream stored the message
   (S, its metadata timestamp, the same for every delivery and every worker): S - C at
   most `AIPD_MAX_ENVELOPE_AGE_MS`, C - S at most `AIPD_MAX_CLOCK_SKEW_MS`. S does not move
   while the message waits in the queue or is redelivered, so a backlog is never refused
   however long it waits; a re-publication of captured bytes is a new message with a new S
   while its C is old, so it is refused once it comes later than the window after C.
   Neither "now - C" (it refuses a backlog) nor "now - S" (it refuses a backlog and accepts
   a fresh re-publication) gives both.
2. **State still there.** C against Redis `TIME` at admission (N): N - C at most the
   result retention (`AIPD_RESULT_TTL_MS`) less the skew allowance. Whichever copy of an
   envelope runs first writes its state at or after S >= C - skew, and that state is kept
   for the retention, so any copy admitted within this bound meets it (and is answered from
   it, never run again); an envelope older than that (a queue stalled for a day, with the
   defaults) can no longer be told from a replay whose state expired, and is refused.

Settings refuse a retention shorter than age + skew, so bound 2 is never tighter than
bound 1. An envelope read from nowhere (no stored time: a caller of the gate outside the
pipeline) is judged on N for both, as before: N - C at most the age, C - N at most the skew.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.store.clock import Clock

DEFAULT_MAX_AGE_MS = 300_000
DEFAULT_MAX_SKEW_MS = 30_000
DEFAULT_STATE_TTL_MS = 86_400_000


def _refused(message: str) -> ConnectorError:
    return ConnectorError(ErrorCode.HOST_REPLAY, message)


@dataclass(frozen=True, slots=True)
class ReplayWindow:
    max_age_ms: int = DEFAULT_MAX_AGE_MS
    max_skew_ms: int = DEFAULT_MAX_SKEW_MS
    #: How long the state of a delivery is kept (`AIPD_RESULT_TTL_MS`).
    state_ttl_ms: int = DEFAULT_STATE_TTL_MS

    @property
    def span_ms(self) -> int:
        """How long after its creation one envelope can be stored and still pass."""
        return self.max_age_ms + self.max_skew_ms

    async def check(
        self, created_at_unix_ms: int, clock: Clock, *, stored_at_ms: int | None = None
    ) -> None:
        """Raise `connector_host.replay` unless the envelope passes both bounds (see the
        module docstring); `stored_at_ms` is the JetStream stored time of its message."""
        now = await clock.now_ms()
        if stored_at_ms is None:
            self._check_age(now - created_at_unix_ms, stored=False)
            return
        self._check_age(stored_at_ms - created_at_unix_ms, stored=True)
        waited_ms = now - created_at_unix_ms
        if waited_ms > self.state_ttl_ms - self.max_skew_ms:
            raise _refused(
                f"envelope created {waited_ms} ms ago: older than the state it would be "
                f"checked against is kept (AIPD_RESULT_TTL_MS {self.state_ttl_ms} less the "
                f"skew allowance {self.max_skew_ms})"
            )

    def _check_age(self, age_ms: int, *, stored: bool) -> None:
        """`age_ms`: the envelope's age when stored (or, outside the pipeline, now)."""
        if age_ms > self.max_age_ms:
            when = "stored" if stored else "seen"
            raise _refused(
                f"envelope {when} {age_ms} ms after it was created; at most "
                f"{self.max_age_ms} ms (AIPD_MAX_ENVELOPE_AGE_MS) is accepted"
            )
        if -age_ms > self.max_skew_ms:
            than = "the time it was stored" if stored else "now"
            raise _refused(
                f"envelope dated {-age_ms} ms in the future of {than}; at most "
                f"{self.max_skew_ms} ms (AIPD_MAX_CLOCK_SKEW_MS) is accepted"
            )
