"""The replay boundary: an envelope is accepted only while it is young, on Redis' clock.

A signed envelope stays valid as bytes forever; what stops it from running twice is the
state its first delivery left in Redis (the lease with its request fingerprint, the stored
result, the operator binding), and that state expires. So an envelope is accepted only
within a window that state is guaranteed to outlive: its `created_at_unix_ms` may be at
most `AIPD_MAX_ENVELOPE_AGE_MS` old and at most `AIPD_MAX_CLOCK_SKEW_MS` in the future,
both measured on Redis `TIME` (never the worker's clock, so workers with skewed clocks
agree). Settings refuse a result retention shorter than age + skew, so an envelope young
enough to pass always meets its stored state. Anything outside the window is
`connector_host.replay`, decided right after the signature and before identity, approval or
any provider request (troubleshooting, "Diagnose trust and routing in order").
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.store.clock import Clock

DEFAULT_MAX_AGE_MS = 300_000
DEFAULT_MAX_SKEW_MS = 30_000


@dataclass(frozen=True, slots=True)
class ReplayWindow:
    max_age_ms: int = DEFAULT_MAX_AGE_MS
    max_skew_ms: int = DEFAULT_MAX_SKEW_MS

    @property
    def span_ms(self) -> int:
        """How long one envelope can keep passing: what the stored state must outlive."""
        return self.max_age_ms + self.max_skew_ms

    async def check(self, created_at_unix_ms: int, clock: Clock) -> None:
        """Raise `connector_host.replay` unless `created_at_unix_ms` is inside the window."""
        now = await clock.now_ms()
        age_ms = now - created_at_unix_ms
        if age_ms > self.max_age_ms:
            raise ConnectorError(
                ErrorCode.HOST_REPLAY,
                f"envelope created {age_ms} ms ago; at most {self.max_age_ms} ms "
                "(AIPD_MAX_ENVELOPE_AGE_MS) is accepted",
            )
        if -age_ms > self.max_skew_ms:
            raise ConnectorError(
                ErrorCode.HOST_REPLAY,
                f"envelope dated {-age_ms} ms in the future; at most {self.max_skew_ms} ms "
                "(AIPD_MAX_CLOCK_SKEW_MS) is accepted",
            )
