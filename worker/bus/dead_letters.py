"""What a refused envelope leaves on the DLQ, and how much of the DLQ a flood can take.

An entry is a signed AIP `action_status` Envelope in state `dead_lettered`
(`worker.wire.dead_letters`). A refused payload is evidence for a person, not work to
replay, and whoever may publish on an actions subject chooses both its size and how many
there are. So an entry keeps at most
`AIPD_DLQ_KEEP_BYTES` of the payload plus its size and sha256 (7.8 MB of junk costs 4 KiB),
and the entries written per source subject pass a token bucket: a refusal over the rate is
terminated like any other but not written, only counted (`dlq_dropped_total{reason="rate"}`).
A DLQ stream at its byte or message limit refuses new entries (`discard: new`); those are
counted as `full`. Neither case is retried: the delivery is terminated either way, so a
flood can never turn into a redelivery loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import StrEnum

from schemas.errors import ErrorCode
from worker.bus.publisher import BusPublisher
from worker.errors import StreamFull
from worker.metrics import Metrics
from worker.wire.dead_letters import dead_letter_facts

log = logging.getLogger(__name__)

#: Source subjects with a bucket of their own; a worker consumes a handful (two per
#: endpoint), so this only bounds memory against a bug, never a real deployment.
MAX_BUCKETS = 1_024
#: At most one "not kept" log line per source subject in this many seconds (with a count).
DROP_LOG_INTERVAL_S = 10.0
#: Longest reason an entry keeps.
MAX_REASON_CHARS = 300


class Kept(StrEnum):
    """What became of one refusal."""

    WRITTEN = "written"
    #: Over the per-subject rate: terminated, not written.
    RATE = "rate"
    #: The DLQ stream refused it (at its limit): terminated, not written.
    FULL = "full"
    #: Its entry is on the DLQ already (the same message refused on an earlier delivery,
    #: which JetStream's dedupe by entry id did not store twice): nothing new to count.
    ALREADY = "already"


class TokenBucket:
    """`rate_per_s` tokens a second, at most `burst` saved up; one token per entry."""

    __slots__ = ("_burst", "_clock", "_rate", "_stamp", "_tokens")

    def __init__(
        self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate_per_s
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class DeadLetters:
    """Writes DLQ entries for one worker: truncated, rate-limited per source subject."""

    def __init__(
        self,
        publisher: BusPublisher,
        metrics: Metrics,
        *,
        worker_id: str,
        keep_bytes: int,
        rate_per_s: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.publisher = publisher
        self.metrics = metrics
        self.worker_id = worker_id
        self.keep_bytes = keep_bytes
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        #: Per source subject: refusals not kept since the last log line, and its time.
        self._unlogged: dict[str, tuple[int, float]] = {}

    async def write(
        self,
        endpoint_id: str,
        *,
        dlq_id: str,
        subject: str,
        stream_seq: int,
        payload: bytes,
        code: ErrorCode,
        reason: str,
        action_id: str | None = None,
    ) -> Kept:
        """Keep one refusal on `endpoint_id`'s DLQ, unless over the rate or the DLQ is full.
        `action_id` only for an Action the worker authenticated (the entry is then filed as
        that Action's status); an unauthenticated one's entry names only its own id.

        Raises `PublishFailed` only when JetStream did not answer at all (the caller's
        delivery is then redelivered later, as for any other failing dependency).
        """
        if not self._bucket(subject).take():
            self._not_kept(endpoint_id, subject, Kept.RATE)
            return Kept.RATE
        facts = dead_letter_facts(
            dlq_id=dlq_id,
            endpoint_id=endpoint_id,
            code=code,
            reason=header_safe(reason),
            subject=subject,
            stream_seq=stream_seq,
            worker_id=self.worker_id,
            payload=payload,
            keep_bytes=self.keep_bytes,
        )
        try:
            ack = await self.publisher.dead_letter(facts, action_id=action_id)
        except StreamFull:
            self._not_kept(endpoint_id, subject, Kept.FULL)
            return Kept.FULL
        # A redelivery of a message refused before (its AckWait ran out while the first
        # refusal was written) names the same entry id: counted once, as the DLQ holds it.
        return Kept.ALREADY if ack.duplicate else Kept.WRITTEN

    def _bucket(self, subject: str) -> TokenBucket:
        bucket = self._buckets.get(subject)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._buckets.clear()  # only fairness between subjects is lost, not the bound
            bucket = TokenBucket(self.rate_per_s, self.burst, self._clock)
            self._buckets[subject] = bucket
        return bucket

    def _not_kept(self, endpoint_id: str, subject: str, why: Kept) -> None:
        """Count it; log it at most once per interval per subject, so a flood of refusals
        cannot become a flood of log lines either."""
        self.metrics.dlq_dropped(endpoint_id, why.value)
        if len(self._unlogged) >= MAX_BUCKETS:
            self._unlogged.clear()
        count, logged_at = self._unlogged.get(subject, (0, float("-inf")))
        now = self._clock()
        if now - logged_at < DROP_LOG_INTERVAL_S:
            self._unlogged[subject] = (count + 1, logged_at)
            return
        self._unlogged[subject] = (0, now)
        log.warning(
            "refused envelope on %s not kept on the DLQ (%s); %d more not kept since the "
            "last such line",
            subject,
            "over the DLQ rate" if why is Kept.RATE else "DLQ stream full",
            count,
            extra={"endpoint": endpoint_id},
        )


def header_safe(text: str) -> str:
    """Printable ASCII only and bounded: a reason may quote attacker-chosen input."""
    return "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in text)[:MAX_REASON_CHARS]
