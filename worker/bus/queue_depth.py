"""Pending and in-flight Actions per endpoint, read from the work consumers themselves.

What an autoscaler needs is the pool's backlog, not one process's: every worker of an
endpoint reads the same durable consumer (`CONSUMER.INFO`, which its role may call) and
reports the same numbers, so aggregate with `max`, not `sum`:

- `queue_pending{endpoint,queue}`: messages on the work queue not yet delivered to any
  worker (the consumer's `num_pending`);
- `queue_in_flight{endpoint,queue}`: messages delivered and not yet acknowledged (its
  `num_ack_pending`): Actions leased or executing somewhere in the pool, including runs
  paused for an approval, which must not be scaled away.

`queue` is `actions` or `delegations`. Refreshed when `/metrics` is scraped
(`worker.scrape_refresh`); a failed read keeps the previous values and is counted in
`errors_total{where="queue_depth"}`. docs/kubernetes.md scales on these without KEDA.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from subjects.grammar import Subjects
from worker.logs import RepeatedErrors
from worker.metrics import Metrics
from worker.scrape_refresh import RefreshedOnScrape

log = logging.getLogger(__name__)

WHERE = "queue_depth"


class QueueDepthGauge(RefreshedOnScrape):
    """Refreshes `queue_pending` and `queue_in_flight` of the served work consumers."""

    def __init__(
        self,
        js: Any,
        subjects: Subjects,
        consumers: Sequence[tuple[str, str]],
        metrics: Metrics,
        errors: RepeatedErrors,
        *,
        min_interval_s: float,
    ) -> None:
        super().__init__(WHERE, self._count, min_interval_s=min_interval_s)
        self.js = js
        self.subjects = subjects
        #: (endpoint id, queue kind) of every work consumer this worker pulls from.
        self.consumers = list(consumers)
        self.metrics = metrics
        self.errors = errors

    async def _count(self) -> None:
        for endpoint_id, kind in self.consumers:
            stream = self.subjects.stream_name(kind)
            durable = self.subjects.durable(endpoint_id, kind)
            try:
                info = await self.js.consumer_info(stream, durable)
            except Exception as exc:  # the previous values stay; the next scrape retries
                cause = type(exc).__name__
                self.errors.report(
                    WHERE, cause, log, "queue depth of %s/%s not read: %s", stream, durable, cause
                )
                continue
            self.metrics.queue_depth(
                endpoint_id,
                kind,
                pending=int(info.num_pending or 0),
                in_flight=int(info.num_ack_pending or 0),
            )
