"""The open-escalations gauge, counted from durable state so every worker reports the truth.

An escalation is open while it is on its stream and has no resolution in Redis (the
authority `escalations resolve` writes first, worker/escalation/ledger.py). A counter in
one process could not know what another worker raised or what a person resolved, and
would start from zero after a restart; so each worker counts from those two stores, and
every worker serving an endpoint reports the same number (aggregate with `max`, not `sum`).

Cost is bounded and incremental. Each process remembers which escalations it saw open and
the stream sequence it read up to; a refresh reads only the messages published since
(at most `MAX_READ_PER_REFRESH`), forgets those the stream's retention has dropped, and
asks Redis about the remembered open ones in pipelined `EXISTS` batches. A resolution is
write-once, so an escalation seen resolved is never asked about again. A refresh runs when
`/metrics` is scraped, at most once per `min_interval_s`; concurrent scrapes share it, and
a scrape waits for it at most `SCRAPE_WAIT_S` (then shows the previous value). A process
that starts reads the stream from its first message; until it has read up to the last one
it publishes no value rather than a partial count. A failed refresh (NATS or Redis down)
keeps the previous value and is counted in `errors_total{where="escalations_open"}`.

Only escalations a trusted worker signed are counted (`trusted`: the worker's trusted
worker keys, or its own key): one that anyone else appended to the stream is skipped and
reported once per refresh as `errors_total{where="escalations_open",cause="unverified"}`,
so a forger can neither raise the gauge nor hide behind it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from schemas.escalation import EscalationKind
from subjects.grammar import Subjects
from worker.escalation.ledger import Unreadable, believe_escalation, read_subject_from
from worker.logs import RepeatedErrors
from worker.metrics import Metrics
from worker.scrape_refresh import RefreshedOnScrape
from worker.store.keys import escalation_resolution_key
from worker.trust.signing import TrustedGatewayKeys

log = logging.getLogger(__name__)

#: Stream messages one refresh reads at most (a restart over a long backlog catches up
#: over several scrapes instead of holding one for long).
MAX_READ_PER_REFRESH = 20_000
#: Open escalations asked about in one Redis pipeline.
EXISTS_BATCH = 1_000
WHERE = "escalations_open"



@dataclass(slots=True)
class _Open:
    seq: int
    kind: EscalationKind


class EndpointEscalations:
    """What one process knows about one endpoint's escalations (rebuilt from the stores)."""

    def __init__(
        self,
        js: JetStreamContext,
        redis: Any,
        subjects: Subjects,
        endpoint_id: str,
        *,
        trusted: TrustedGatewayKeys | None = None,
    ):
        self.js = js
        #: The worker keys whose escalations count; None counts every one that decodes
        #: (a worker that publishes unsigned, development only).
        self.trusted = trusted
        self.redis = redis
        self.endpoint_id = endpoint_id
        self.stream = subjects.stream_name("escalations")
        self.subject = subjects.escalations(endpoint_id)
        #: Open escalations by id, with the stream sequence of their latest copy.
        self.open: dict[str, _Open] = {}
        #: Highest stream sequence read on `subject` (0: nothing yet).
        self.read_to = 0
        #: Messages on the subject that are not an Escalation (skipped, never guessed at).
        self.unreadable = 0
        #: Escalations no trusted worker signed (skipped: forged or unsigned).
        self.unverified = 0

    async def refresh(self) -> bool:
        """Bring `open` up to date; True when it covers everything on the stream now."""
        info = await self.js.stream_info(self.stream)
        try:
            last = (await self.js.get_last_msg(self.stream, self.subject)).seq or 0
        except NotFoundError:
            last = 0  # no escalation of this endpoint is on the stream
        first = info.state.first_seq
        if last > self.read_to:
            start = max(self.read_to + 1, first)
            for seq, data in await read_subject_from(
                self.js, self.subject, stream=self.stream, start_seq=start,
                limit=MAX_READ_PER_REFRESH,
            ):
                self._take(seq, data)
                self.read_to = max(self.read_to, seq)
        # Retention dropped these: they are in no list any more, in any process.
        for escalation_id in [e for e, o in self.open.items() if o.seq < first]:
            del self.open[escalation_id]
        await self._forget_resolved()
        return self.read_to >= last

    def _take(self, seq: int, data: bytes) -> None:
        skipped = Unreadable()
        escalation = believe_escalation(data, self.trusted, skipped)
        self.unreadable += skipped.count
        self.unverified += len(skipped.unverified)
        if escalation is not None:
            self.open[escalation.escalation_id] = _Open(seq, escalation.kind)

    async def _forget_resolved(self) -> None:
        ids = list(self.open)
        for at in range(0, len(ids), EXISTS_BATCH):
            batch = ids[at : at + EXISTS_BATCH]
            pipe = self.redis.pipeline(transaction=False)
            for escalation_id in batch:
                pipe.exists(escalation_resolution_key(escalation_id))
            for escalation_id, found in zip(batch, await pipe.execute(), strict=True):
                if int(found):
                    self.open.pop(escalation_id, None)

    def counts(self) -> dict[EscalationKind, int]:
        out = dict.fromkeys(EscalationKind, 0)
        for entry in self.open.values():
            out[entry.kind] += 1
        return out


class OpenEscalationsGauge(RefreshedOnScrape):
    """Refreshes the `escalations_open` gauge of every served endpoint when scraped."""

    def __init__(
        self,
        endpoints: Sequence[EndpointEscalations],
        metrics: Metrics,
        errors: RepeatedErrors,
        *,
        min_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(WHERE, self._count, min_interval_s=min_interval_s, clock=clock)
        self.endpoints = list(endpoints)
        self.metrics = metrics
        self.errors = errors

    async def _count(self) -> None:
        for endpoint in self.endpoints:
            unreadable, unverified = endpoint.unreadable, endpoint.unverified
            try:
                complete = await endpoint.refresh()
            except Exception as exc:  # the previous value stays; the next scrape retries
                cause = type(exc).__name__
                self.errors.report(
                    WHERE, cause, log, "open escalations of %s not counted: %s",
                    endpoint.endpoint_id, cause,
                )  # fmt: skip
                continue
            if endpoint.unreadable > unreadable:
                self.errors.report(
                    WHERE, "unreadable", log, "%d message(s) on %s are not escalations",
                    endpoint.unreadable - unreadable, endpoint.subject,
                )  # fmt: skip
            if endpoint.unverified > unverified:
                self.errors.report(
                    WHERE, "unverified", log,
                    "%d escalation(s) on %s are not signed by a trusted worker: not counted",
                    endpoint.unverified - unverified, endpoint.subject,
                )  # fmt: skip
            if complete:
                for kind, count in endpoint.counts().items():
                    self.metrics.escalations_open(endpoint.endpoint_id, kind.value, count)
