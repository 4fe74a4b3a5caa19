"""Prometheus metrics of one worker process, in its own registry.

Every number an operator needs to tell "healthy and busy" from "stuck" or "losing work":
deliveries and how each one ended, settled Actions by capability and status, what is in
flight, lease takeovers and losses, fence rejections (a stale worker stopped), dead letters,
provider latency and status per route template, chunks, uncertain outcomes and the heartbeat.

The registry is private (not prometheus-client's global one) so several workers can live in
one test process and a library importing prometheus-client cannot leak series into ours.
Recording is on the hot path, so each method looks its label child up in a plain dict first
and only asks prometheus-client (which takes a lock) the first time a label set is seen.

Label values come from bounded sets (endpoint ids, registered capabilities, route templates,
error codes), but a refused envelope may name any capability string. A family therefore
folds label sets beyond `MAX_SERIES_PER_FAMILY` into `OTHER`, so a hostile publisher cannot
grow the scrape without bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Generic, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from worker import __version__

PREFIX = "aip_hermes_worker"
#: Distinct label sets one family keeps before folding new ones into `OTHER`.
MAX_SERIES_PER_FAMILY = 2_000
OTHER = "_other"

#: Provider exchanges range from a 5 ms discovery read to a 15-minute operator stream.
PROVIDER_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
)  # fmt: skip
#: A renewal round trip is one pipelined Redis call; above a third of the TTL it is a problem.
HEARTBEAT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class DeliveryOutcome(StrEnum):
    """How the worker answered one JetStream delivery of an Action (docs/architecture.md §4)."""

    #: Leased and handed to its operation (whatever the operation's result).
    EXECUTED = "executed"
    #: Trusted envelope that may not run: one failed result was settled.
    REFUSED = "refused"
    #: Undecodable, over-size, unsigned or colliding: kept on the DLQ and terminated.
    DEAD_LETTERED = "dead_lettered"
    #: Another live owner holds the lease: nak'ed until that lease ends.
    DUPLICATE = "duplicate"
    #: Already settled: the stored result was published again and the message acked.
    REPUBLISHED = "republished"
    #: Refused (a replay after its state expired, say), but the bus already holds the
    #: result of this exact envelope: nothing was published, the message acked.
    ANSWERED = "answered"
    #: A redelivery of an Action this very worker runs: acked with it when it settles.
    JOINED = "joined"
    #: Its idempotency key is held by another Action: answered with that one's result.
    REPLAYED = "replayed"
    #: Its idempotency key's holder has not settled yet: nak'ed until it has.
    WAITING = "waiting"
    #: The handler failed unexpectedly: nak'ed for a later redelivery.
    ERROR = "error"
    #: Redis was failing or near maxmemory: nak'ed (no new lease) for another worker.
    DEFERRED = "deferred"


class FenceStep(StrEnum):
    """Where a fenced write found that a newer owner holds the Action."""

    SETTLE = "settle"
    RENEW = "renew"
    UNSAFE_ATTEMPT = "unsafe_attempt"
    BINDING = "binding"


_Child = TypeVar("_Child")


class _Family(Generic[_Child]):
    """Label children cached by value tuple, with a bound on how many exist."""

    __slots__ = ("_children", "_make")

    def __init__(self, make: Callable[..., _Child]) -> None:
        self._make = make
        self._children: dict[tuple[str, ...], _Child] = {}

    def get(self, *values: str) -> _Child:
        child = self._children.get(values)
        if child is None:
            if len(self._children) >= MAX_SERIES_PER_FAMILY:
                values = tuple(OTHER for _ in values)
                child = self._children.get(values)
            if child is None:
                child = self._make(*values)
                self._children[values] = child
        return child


class Metrics:
    """The worker's metrics; one instance per process, shared by every component.

    Method names say which runtime step calls them (see docs/operations.md, "Metrics").
    """

    def __init__(self, *, worker_id: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        info = Gauge(
            f"{PREFIX}_info", "Constant 1, labelled with this worker's id and version",
            ["worker_id", "version"], registry=r,
        )
        info.labels(worker_id, __version__).set(1)
        self._deliveries = Counter(
            f"{PREFIX}_deliveries", "Action deliveries by endpoint and how they were answered",
            ["endpoint", "outcome"], registry=r,
        )
        self._actions = Counter(
            f"{PREFIX}_actions", "Actions settled by this worker, by capability, status and code",
            ["capability", "status", "code"], registry=r,
        )
        self._in_flight = Gauge(
            f"{PREFIX}_in_flight", "Leased Actions executing on this worker now",
            ["endpoint"], registry=r,
        )
        self._takeovers = Counter(
            f"{PREFIX}_lease_takeovers", "Leases acquired from an owner whose lease had expired",
            ["endpoint"], registry=r,
        )
        self._lost = Counter(
            f"{PREFIX}_leases_lost", "Executions stopped because their lease was lost",
            ["endpoint"], registry=r,
        )
        self._fenced = Counter(
            f"{PREFIX}_fence_rejections", "Fenced writes refused because a newer owner exists",
            ["endpoint", "step"], registry=r,
        )
        self._dlq = Counter(
            f"{PREFIX}_dlq_entries", "Envelopes dead-lettered, by endpoint and error code",
            ["endpoint", "code"], registry=r,
        )
        self._dlq_dropped = Counter(
            f"{PREFIX}_dlq_dropped",
            "Refused envelopes terminated without a DLQ entry: over the per-subject rate "
            "('rate') or refused by a full DLQ stream ('full')",
            ["endpoint", "reason"], registry=r,
        )
        self._provider_seconds = Histogram(
            f"{PREFIX}_provider_request_seconds",
            "Hermes exchange duration (to the end of the body or stream), by route template",
            ["endpoint", "method", "route"], buckets=PROVIDER_BUCKETS, registry=r,
        )
        self._provider_status = Counter(
            f"{PREFIX}_provider_responses",
            "Hermes answers by route template and HTTP status ('transport' when none came)",
            ["endpoint", "method", "route", "status"], registry=r,
        )
        self._chunks = Counter(
            f"{PREFIX}_chunks_published", "StreamChunks published, by endpoint and kind",
            ["endpoint", "kind"], registry=r,
        )
        self._unknown = Counter(
            f"{PREFIX}_outcome_unknown",
            "Actions settled with uncertain_outcome (sent, result unknown, never replayed)",
            ["capability"], registry=r,
        )
        self._escalations = Counter(
            f"{PREFIX}_escalations_raised",
            "Escalations this worker's fenced settles raised, by endpoint and kind",
            ["endpoint", "kind"], registry=r,
        )
        self._escalations_open = Gauge(
            f"{PREFIX}_escalations_open",
            "Escalations on the stream without a resolution, by endpoint and kind, counted "
            "from NATS and Redis when scraped (every worker of an endpoint reports the same)",
            ["endpoint", "kind"], registry=r,
        )
        self._queue_pending = Gauge(
            f"{PREFIX}_queue_pending",
            "Messages on an endpoint's work queue not yet delivered to any worker (the "
            "consumer's num_pending, read when scraped; every worker reports the same)",
            ["endpoint", "queue"], registry=r,
        )
        self._queue_in_flight = Gauge(
            f"{PREFIX}_queue_in_flight",
            "Messages delivered from an endpoint's work queue and not yet acknowledged, pool-"
            "wide (the consumer's num_ack_pending, read when scraped; every worker reports "
            "the same)",
            ["endpoint", "queue"], registry=r,
        )
        self._channel = Counter(
            f"{PREFIX}_channel_deliveries",
            "Channel deliveries this worker started (results or escalations into a session)",
            ["endpoint", "source"], registry=r,
        )
        self._ingress = Counter(
            f"{PREFIX}_channel_ingress_messages",
            "Session messages taken by channel ingress: published, or refused (dead-lettered)",
            ["endpoint", "outcome"], registry=r,
        )
        self._ingress_lag = Gauge(
            f"{PREFIX}_channel_ingress_lag_seconds",
            "Age of the oldest session message not yet published at the last poll (0: caught up)",
            ["endpoint", "session"], registry=r,
        )
        self._heartbeats = Counter(
            f"{PREFIX}_heartbeat_round_trips", "Lease renewal round trips by result",
            ["result"], registry=r,
        )
        self._backstop = Counter(
            f"{PREFIX}_lease_backstop_round_trips",
            "Lease renewal round trips the backstop thread sent while the heartbeat was "
            "behind, by result",
            ["result"], registry=r,
        )
        self.heartbeat_seconds = Histogram(
            f"{PREFIX}_heartbeat_seconds", "Duration of one pipelined renewal of every lease",
            buckets=HEARTBEAT_BUCKETS, registry=r,
        )
        self.leases_held = Gauge(
            f"{PREFIX}_leases_held", "Leases the heartbeat renewed on its last tick", registry=r,
        )
        self._errors = Counter(
            f"{PREFIX}_errors", "Repeated failures by where and cause (logged once per interval)",
            ["where", "cause"], registry=r,
        )
        self.store_accepting = Gauge(
            f"{PREFIX}_store_accepting",
            "1 while Redis answers and has room for new leases (the worker fetches only then)",
            registry=r,
        )
        self.heartbeat_strained = Gauge(
            f"{PREFIX}_heartbeat_strained",
            "1 while fetching is paused because the last lease renewal round trip took more "
            "than half the heartbeat interval (the worker is overloaded)",
            registry=r,
        )
        self._ready = Gauge(
            f"{PREFIX}_ready", "1 when the named readiness check passed at its last evaluation",
            ["check"], registry=r,
        )
        self._trust_expired = Gauge(
            f"{PREFIX}_trust_entries_expired",
            "Entries of a trust file ('identity', 'authority') skipped at start-up because "
            "they had expired (renew or remove them)",
            ["file"], registry=r,
        )
        self._f_deliveries = _Family(self._deliveries.labels)
        self._f_actions = _Family(self._actions.labels)
        self._f_in_flight = _Family(self._in_flight.labels)
        self._f_takeovers = _Family(self._takeovers.labels)
        self._f_lost = _Family(self._lost.labels)
        self._f_fenced = _Family(self._fenced.labels)
        self._f_dlq = _Family(self._dlq.labels)
        self._f_dlq_dropped = _Family(self._dlq_dropped.labels)
        self._f_seconds = _Family(self._provider_seconds.labels)
        self._f_status = _Family(self._provider_status.labels)
        self._f_chunks = _Family(self._chunks.labels)
        self._f_unknown = _Family(self._unknown.labels)
        self._f_heartbeats = _Family(self._heartbeats.labels)
        self._f_escalations = _Family(self._escalations.labels)
        self._f_escalations_open = _Family(self._escalations_open.labels)
        self._f_channel = _Family(self._channel.labels)
        self._f_ingress = _Family(self._ingress.labels)
        self._f_ingress_lag = _Family(self._ingress_lag.labels)
        self._f_ready = _Family(self._ready.labels)
        self._f_errors = _Family(self._errors.labels)

    # --- delivery (worker/pipeline/) -----------------------------------------------------

    def delivery(self, endpoint: str, outcome: DeliveryOutcome) -> None:
        """One delivery answered; call once per message, with how it ended."""
        self._f_deliveries.get(endpoint, outcome.value).inc()

    def dead_lettered(self, endpoint: str, code: str) -> None:
        """An envelope went to the DLQ with `code` (also counts the delivery)."""
        self._f_dlq.get(endpoint, code).inc()
        self.delivery(endpoint, DeliveryOutcome.DEAD_LETTERED)

    def exhausted_dead_lettered(self, endpoint: str, code: str, *, kept: bool) -> None:
        """An Action whose retry policy was spent got its DLQ entry (`kept`), or a full DLQ
        stream refused it (`full`). Its delivery was counted when it settled."""
        if kept:
            self._f_dlq.get(endpoint, code).inc()
        else:
            self._f_dlq_dropped.get(endpoint, "full").inc()

    def dlq_dropped(self, endpoint: str, reason: str) -> None:
        """A refused envelope was terminated without a DLQ entry (`rate` or `full`); it
        still counts as a dead-lettered delivery, since it was refused the same way."""
        self._f_dlq_dropped.get(endpoint, reason).inc()
        self.delivery(endpoint, DeliveryOutcome.DEAD_LETTERED)

    def takeover(self, endpoint: str) -> None:
        """A lease was acquired from an expired owner (`grant.is_takeover`)."""
        self._f_takeovers.get(endpoint).inc()

    @contextmanager
    def executing(self, endpoint: str) -> Iterator[None]:
        """Around one leased execution: the in-flight gauge, exact even on cancellation."""
        gauge = self._f_in_flight.get(endpoint)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()

    def settled(
        self, capability: str, status: str, code: str | None = None, *, uncertain: bool = False
    ) -> None:
        """One ActionResult written by this worker's fenced settle (or a refusal)."""
        self._f_actions.get(capability, status, code or "").inc()
        if uncertain:
            self._f_unknown.get(capability).inc()

    def escalation_raised(self, endpoint: str, kind: str) -> None:
        """One Escalation published right after this worker's own fenced settle."""
        self._f_escalations.get(endpoint, kind).inc()

    def escalations_open(self, endpoint: str, kind: str, count: int) -> None:
        """How many escalations are open now (worker/escalation/gauge.py, from the stores)."""
        self._f_escalations_open.get(endpoint, kind).set(count)

    def queue_depth(self, endpoint: str, queue: str, *, pending: int, in_flight: int) -> None:
        """The work consumer's backlog now (worker/bus/queue_depth.py)."""
        self._queue_pending.labels(endpoint, queue).set(pending)
        self._queue_in_flight.labels(endpoint, queue).set(in_flight)

    def channel_delivery(self, endpoint: str, source: str) -> None:
        """One channel delivery taken from the egress queue towards a Hermes session."""
        self._f_channel.get(endpoint, source).inc()

    def channel_ingress_published(self, endpoint: str) -> None:
        self._f_ingress.get(endpoint, "published").inc()

    def channel_ingress_refused(self, endpoint: str) -> None:
        self._f_ingress.get(endpoint, "refused").inc()

    def channel_ingress_error(self, endpoint: str, kind: str) -> None:
        """A poll that failed (Hermes, Redis or NATS); it is retried, nothing advanced."""
        self._f_ingress.get(endpoint, "poll_failed").inc()

    def channel_ingress_lag(self, endpoint: str, session: str, seconds: float) -> None:
        self._f_ingress_lag.get(endpoint, session).set(seconds)

    def fenced_out(self, endpoint: str, step: FenceStep) -> None:
        """A fenced write was refused: a newer owner exists, this worker stops."""
        self._f_fenced.get(endpoint, step.value).inc()

    def chunk_published(self, endpoint: str, kind: str) -> None:
        """One StreamChunk handed to JetStream (terminal chunks included)."""
        self._f_chunks.get(endpoint, kind).inc()

    # --- heartbeat (worker/execution/leases.py) -----------------------------------------

    def heartbeat(self, seconds: float, *, leases: int, ok: bool) -> None:
        """One renewal round trip of every held lease, and whether Redis answered it."""
        self._f_heartbeats.get("ok" if ok else "failed").inc()
        if ok:
            self.heartbeat_seconds.observe(seconds)
            self.leases_held.set(leases)

    def backstop_renewal(self, result: str) -> None:
        """One renewal round trip by the backstop thread (`ok`, `failed`); thread-safe."""
        self._backstop.labels(result).inc()

    def lease_lost(self, endpoint: str) -> None:
        """An execution was cancelled because its lease was lost."""
        self._f_lost.get(endpoint).inc()

    # --- provider (worker/hermes/http_client.py) ---------------------------------------------

    def provider_call(
        self, endpoint: str, method: str, route: str, status: int | None, seconds: float
    ) -> None:
        """One Hermes exchange by route *template* (never the filled path: ids are unbounded).

        `status` is None when no HTTP answer arrived (connect error, timeout, reset).
        """
        self._f_seconds.get(endpoint, method, route).observe(seconds)
        label = "transport" if status is None else str(status)
        self._f_status.get(endpoint, method, route, label).inc()

    # --- repeated errors (worker/logs.py RepeatedErrors) --------------------------------

    def error(self, where: str, cause: str) -> None:
        """One failure of a repeated kind; the log shows it at most once per interval."""
        self._f_errors.get(where, cause).inc()

    # --- health (worker/health.py) -------------------------------------------------------

    def trust_entries_expired(self, file: str, count: int) -> None:
        """How many entries of trust file `file` were skipped at load as expired."""
        self._trust_expired.labels(file).set(count)

    def readiness(self, check: str, ok: bool) -> None:
        """The result of one readiness check, so dashboards see which one failed."""
        self._f_ready.get(check).set(1 if ok else 0)

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every metric and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
