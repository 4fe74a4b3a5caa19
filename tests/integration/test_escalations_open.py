"""The `escalations_open` gauge tells the truth across processes and restarts: it is counted
from the escalation stream and the write-once resolutions in Redis, never from what one
process raised. Real NATS and Redis; the last test runs real worker processes and the
`escalations resolve` CLI."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import nats
import pytest
from nats.aio.client import Client as NATS
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from schemas.escalation import (
    Escalation,
    EscalationKind,
    EscalationResolution,
    ResolutionKind,
)
from schemas.ids import capability_id, new_action_id
from schemas.result import ResultStatus
from subjects.grammar import Subjects
from tests.integration.stack import ENDPOINT, Stack, provision_streams
from tests.integration.test_escalations import escalations, resolve
from worker.bus.publisher import BusPublisher
from worker.escalation.build import escalation_id
from worker.escalation.gauge import EndpointEscalations, OpenEscalationsGauge
from worker.escalation.ledger import record_resolution
from worker.logs import RepeatedErrors
from worker.metrics import Metrics
from worker.testing.identities import APPROVER_UNTENANTED
from worker.testing.scenario import NEEDS_APPROVAL
from worker.testing.services import ServiceHandle, free_port

OPEN = "aip_hermes_worker_escalations_open"


@dataclass
class Bus:
    nc: NATS
    redis: Redis
    subjects: Subjects

    def gauge(self, *, min_interval_s: float = 0.0) -> tuple[OpenEscalationsGauge, Metrics]:
        """What one worker process builds: its own metrics, its own view of the stores."""
        metrics = Metrics(worker_id=f"w-{time.monotonic_ns()}")
        gauge = OpenEscalationsGauge(
            [EndpointEscalations(self.nc.jetstream(), self.redis, self.subjects, ENDPOINT)],
            metrics,
            RepeatedErrors(on_count=metrics.error),
            min_interval_s=min_interval_s,
        )
        return gauge, metrics

    async def raise_one(self, kind: EscalationKind = EscalationKind.DECISION) -> Escalation:
        action_id = new_action_id()
        escalation = Escalation(
            escalation_id=escalation_id(action_id, 0),
            kind=kind,
            action_id=action_id,
            endpoint_id=ENDPOINT,
            capability=capability_id(ENDPOINT, "operator"),
            status=ResultStatus.FAILED,
            decision="reconcile with the run owner",
            runbook="runbook.md#operator_outcome_unknown",
            principal_id="user:alice",
            principal_kind="user",
            evidence=[],
            raised_by="w0",
            fence=1,
            raised_at_unix_ms=time.time_ns() // 1_000_000,
        )
        await BusPublisher(self.nc.jetstream(), self.subjects, nc=self.nc).escalation(escalation)
        return escalation

    async def acknowledge(self, escalation: Escalation) -> None:
        await record_resolution(
            self.redis,
            EscalationResolution(
                escalation_id=escalation.escalation_id,
                action_id=escalation.action_id,
                endpoint_id=ENDPOINT,
                kind=ResolutionKind.ACKNOWLEDGED,
                resolved_by="ops:erin",
                reason="taken over",
                resolved_at_unix_ms=time.time_ns() // 1_000_000,
            ),
        )


@pytest.fixture
async def bus(nats_server: ServiceHandle, redis_server: ServiceHandle) -> AsyncIterator[Bus]:
    await provision_streams(nats_server.url)
    nc = await nats.connect(nats_server.url)
    redis = Redis.from_url(redis_server.url)
    try:
        yield Bus(nc, redis, Subjects())
    finally:
        await redis.aclose()
        await nc.close()


def value(metrics: Metrics | str, name: str, **labels: str) -> float | None:
    """A sample's value, or None when the series does not exist."""
    text = metrics if isinstance(metrics, str) else metrics.render()[0].decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def open_count(metrics: Metrics | str, kind: str = "decision") -> float | None:
    return value(metrics, OPEN, endpoint=ENDPOINT, kind=kind)


async def test_the_gauge_counts_what_the_stores_hold_in_every_process(bus: Bus) -> None:
    first, second, third = [await bus.raise_one() for _ in range(3)]
    await bus.raise_one(EscalationKind.APPROVAL)
    gauge, metrics = bus.gauge()
    await gauge.before_scrape()
    assert open_count(metrics) == 3
    assert open_count(metrics, "approval") == 1

    await bus.acknowledge(second)
    # A process that raised none of them (another worker, or this one restarted) agrees.
    other, other_metrics = bus.gauge()
    await gauge.before_scrape()
    await other.before_scrape()
    assert open_count(metrics) == open_count(other_metrics) == 2

    # Read incrementally: a new escalation and a resolution both show at the next scrape.
    fourth = await bus.raise_one()
    await bus.acknowledge(first)
    await gauge.before_scrape()
    assert open_count(metrics) == 2
    await bus.acknowledge(third)
    await bus.acknowledge(fourth)
    await gauge.before_scrape()
    assert open_count(metrics) == 0
    assert open_count(metrics, "approval") == 1


async def test_escalations_dropped_by_retention_are_no_longer_open(bus: Bus) -> None:
    js = bus.nc.jetstream()
    stream = bus.subjects.stream_name("escalations")
    await bus.raise_one()
    await bus.raise_one()
    gauge, metrics = bus.gauge()
    await gauge.before_scrape()
    assert open_count(metrics) == 2
    last = (await js.stream_info(stream)).state.last_seq
    await js.purge_stream(stream, keep=1)  # what max_age / max_bytes do to the oldest
    assert (await js.stream_info(stream)).state.first_seq == last
    await gauge.before_scrape()
    assert open_count(metrics) == 1


async def test_a_message_that_is_no_escalation_is_skipped_and_counted(bus: Bus) -> None:
    await bus.raise_one()
    await bus.nc.jetstream().publish(bus.subjects.escalations(ENDPOINT), b'{"not": "one"}')
    gauge, metrics = bus.gauge()
    await gauge.before_scrape()
    assert open_count(metrics) == 1
    assert value(metrics, "aip_hermes_worker_errors_total", where="escalations_open",
                 cause="unreadable") == 1  # fmt: skip


async def test_scrapes_within_the_interval_reuse_the_last_count(bus: Bus) -> None:
    escalation = await bus.raise_one()
    gauge, metrics = bus.gauge(min_interval_s=60.0)
    await gauge.before_scrape()
    await bus.acknowledge(escalation)
    await asyncio.gather(*(gauge.before_scrape() for _ in range(5)))
    assert open_count(metrics) == 1  # no store was read again within the interval
    gauge.min_interval_s = 0.0
    await gauge.before_scrape()
    assert open_count(metrics) == 0


@pytest.mark.chaos
async def test_a_failing_store_keeps_the_last_value_and_counts_the_failure(
    bus: Bus, redis_server: ServiceHandle
) -> None:
    escalation = await bus.raise_one()
    gauge, metrics = bus.gauge()
    await gauge.before_scrape()
    assert open_count(metrics) == 1
    redis_server.stop()
    try:
        await gauge.before_scrape()
        assert open_count(metrics) == 1
        failures = [
            s.value
            for f in text_string_to_metric_families(metrics.render()[0].decode())
            for s in f.samples
            if s.name == "aip_hermes_worker_errors_total"
            and s.labels.get("where") == "escalations_open"
        ]
        assert sum(failures) == 1
    finally:
        redis_server.start()
    await bus.acknowledge(escalation)
    await gauge.before_scrape()
    assert open_count(metrics) == 0


async def _scrape(port: int) -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        assert response.status == 200
        return await response.text()


async def test_a_raised_approval_is_open_on_every_worker_until_it_is_answered(
    stack: Stack,
) -> None:
    ports = [free_port(), free_port()]
    scraped = {"AIPD_ESCALATIONS_OPEN_REFRESH_MS": "0"}
    await stack.spawn("w1", AIPD_METRICS_PORT=str(ports[0]), **scraped)
    source = stack.action("operator", {"objective": f"{NEEDS_APPROVAL} tidy the files"})
    await stack.approve(source)
    paused = await (await stack.publish(source)).result(timeout_s=60)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    [escalation] = await escalations(stack)
    assert open_count(await _scrape(ports[0]), "approval") == 1

    # A worker started afterwards raised nothing and still reports it: it reads the stores.
    stack.workers[0].kill()
    await stack.spawn("w2", AIPD_METRICS_PORT=str(ports[1]), **scraped)
    text = await _scrape(ports[1])
    assert open_count(text, "approval") == 1
    assert value(text, "aip_hermes_worker_escalations_raised_total", endpoint=ENDPOINT,
                 kind="approval") is None  # fmt: skip

    key = str(stack.trust.approver_seed_files[APPROVER_UNTENANTED])
    code, _, err = await resolve(
        stack, escalation.escalation_id, "--as", APPROVER_UNTENANTED, "--key", key,
        "--choice", "once", "--sign-key", str(stack.trust.seed_file),
    )  # fmt: skip
    assert code == 0, err
    assert open_count(await _scrape(ports[1]), "approval") == 0
