"""Metrics and health (issue 8): what an operator scrapes, and what a load balancer asks.

The first tests pin the pieces (label caching, the series bound, readiness semantics and its
Hermes cache) with no services. The last one runs a real worker process against real NATS,
Redis and the fake Hermes, scrapes `/metrics` and `/ready` while it works, and stops Redis
to see readiness turn false and come back.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.result import ResultStatus
from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from worker.client import AipClient
from worker.health import AsyncCheck, HealthServer, Readiness
from worker.metrics import MAX_SERIES_PER_FAMILY, OTHER, DeliveryOutcome, FenceStep, Metrics
from worker.testing._procs import free_port
from worker.testing.fake_hermes import FakeHermes
from worker.testing.identities import (
    ISSUER,
    PRINCIPAL_KIND,
    REVISION,
    USER_UNTENANTED,
    write_api_key_file,
    write_trust_files,
)
from worker.testing.services import ServiceHandle
from worker.testing.workers import WorkerProcess

ENDPOINT = "h1"
CAP = f"cap:hermes_agent:{ENDPOINT}:models"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape, keyed by name and label set."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, frozenset(labels.items())), 0.0)


# --- Metrics ---------------------------------------------------------------------------


def test_each_runtime_step_is_counted_under_its_labels() -> None:
    metrics = Metrics(worker_id="w1")
    metrics.delivery(ENDPOINT, DeliveryOutcome.EXECUTED)
    metrics.delivery(ENDPOINT, DeliveryOutcome.EXECUTED)
    metrics.dead_lettered(ENDPOINT, "schema.envelope.invalid")
    metrics.settled(CAP, "completed")
    metrics.settled(CAP, "failed", "connector.hermes_agent.transport", uncertain=True)
    metrics.takeover(ENDPOINT)
    metrics.lease_lost(ENDPOINT)
    metrics.fenced_out(ENDPOINT, FenceStep.SETTLE)
    metrics.chunk_published(ENDPOINT, "data")
    metrics.provider_call(ENDPOINT, "GET", "/v1/runs/{run_id}", 200, 0.02)
    metrics.provider_call(ENDPOINT, "GET", "/v1/runs/{run_id}", None, 3.0)
    metrics.heartbeat(0.002, leases=5, ok=True)
    metrics.heartbeat(1.0, leases=5, ok=False)
    with metrics.executing(ENDPOINT):
        during, _ = metrics.render()
    after, content_type = metrics.render()
    text = after.decode()

    p = "aip_hermes_worker"
    assert content_type.startswith("text/plain")
    assert value(text, f"{p}_info", worker_id="w1", version="0.1.0") == 1
    assert value(text, f"{p}_deliveries_total", endpoint=ENDPOINT, outcome="executed") == 2
    assert value(text, f"{p}_deliveries_total", endpoint=ENDPOINT, outcome="dead_lettered") == 1
    assert (
        value(text, f"{p}_dlq_entries_total", endpoint=ENDPOINT, code="schema.envelope.invalid")
        == 1
    )
    assert value(text, f"{p}_actions_total", capability=CAP, status="completed", code="") == 1
    assert value(text, f"{p}_outcome_unknown_total", capability=CAP) == 1
    assert value(text, f"{p}_lease_takeovers_total", endpoint=ENDPOINT) == 1
    assert value(text, f"{p}_leases_lost_total", endpoint=ENDPOINT) == 1
    assert value(text, f"{p}_fence_rejections_total", endpoint=ENDPOINT, step="settle") == 1
    assert value(text, f"{p}_chunks_published_total", endpoint=ENDPOINT, kind="data") == 1
    route = {"endpoint": ENDPOINT, "method": "GET", "route": "/v1/runs/{run_id}"}
    assert value(text, f"{p}_provider_responses_total", **route, status="200") == 1
    assert value(text, f"{p}_provider_responses_total", **route, status="transport") == 1
    assert value(text, f"{p}_provider_request_seconds_count", **route) == 2
    assert value(text, f"{p}_heartbeat_round_trips_total", result="ok") == 1
    assert value(text, f"{p}_heartbeat_round_trips_total", result="failed") == 1
    assert value(text, f"{p}_leases_held") == 5
    assert value(during.decode(), f"{p}_in_flight", endpoint=ENDPOINT) == 1
    assert value(text, f"{p}_in_flight", endpoint=ENDPOINT) == 0


def test_two_workers_in_one_process_keep_separate_registries() -> None:
    first, second = Metrics(worker_id="a"), Metrics(worker_id="b")
    first.delivery(ENDPOINT, DeliveryOutcome.DUPLICATE)
    text = second.render()[0].decode()
    assert (
        value(text, "aip_hermes_worker_deliveries_total", endpoint=ENDPOINT, outcome="duplicate")
        == 0
    )


def test_unbounded_label_values_fold_into_other() -> None:
    metrics = Metrics(worker_id="w1")
    for n in range(MAX_SERIES_PER_FAMILY + 50):
        metrics.settled(f"cap:hermes_agent:{ENDPOINT}:bogus{n}", "failed", "x")
    text = metrics.render()[0].decode()
    series = [key for key in samples(text) if key[0] == "aip_hermes_worker_actions_total"]
    assert len(series) == MAX_SERIES_PER_FAMILY + 1
    assert (
        value(text, "aip_hermes_worker_actions_total", capability=OTHER, status=OTHER, code=OTHER)
        == 50
    )


# --- Readiness ---------------------------------------------------------------------------


class FakeProbe:
    def __init__(self) -> None:
        self.nats = True
        self.consumers = {"hermes_h1_actions": True}
        self.redis_ok = True
        self.redis_delay_s = 0.0
        self.hermes_ok = True
        self.hermes_calls = 0
        self.reasons: list[str] = []
        self.publish_reason: str | None = None

    def nats_connected(self) -> bool:
        return self.nats

    def consumers_bound(self) -> Mapping[str, bool]:
        return self.consumers

    async def redis_ping(self) -> bool:
        await asyncio.sleep(self.redis_delay_s)
        return self.redis_ok

    def hermes_checks(self) -> Mapping[str, AsyncCheck]:
        async def check() -> bool:
            self.hermes_calls += 1
            if not self.hermes_ok:
                raise ConnectionError("refused")
            return True

        return {ENDPOINT: check}

    def serving_reasons(self) -> tuple[bool, list[str]]:
        return not self.reasons, self.reasons

    def publish_failure(self) -> str | None:
        return self.publish_reason


@pytest.mark.parametrize(
    ("broken", "check"),
    [
        ({"nats": False}, "nats_connected"),
        ({"consumers": {"hermes_h1_actions": False}}, "consumers_bound"),
        ({"consumers": {}}, "consumers_bound"),
        ({"redis_ok": False}, "redis"),
        ({"redis_delay_s": 1.5}, "redis"),
        ({"hermes_ok": False}, "hermes"),
        ({"reasons": ["cannot sign results: AIPD_WORKER_SIGNING_KEY_FILE is not set"]},
         "serving"),
        ({"publish_reason": "JetStream publication failing: the store refused a write"},
         "jetstream_publish"),
    ],
)
async def test_ready_is_false_when_any_one_dependency_fails(
    broken: dict[str, Any], check: str
) -> None:
    probe = FakeProbe()
    metrics = Metrics(worker_id="w1")
    assert (await Readiness(probe, metrics=metrics).evaluate())["ready"] is True
    for name, setting in broken.items():
        setattr(probe, name, setting)
    document = await Readiness(probe, metrics=metrics).evaluate()
    assert document["ready"] is False
    checks = document["checks"]
    assert isinstance(checks, dict)
    assert [name for name, ok in checks.items() if not ok] == [check]
    text = metrics.render()[0].decode()
    assert value(text, "aip_hermes_worker_ready", check=check) == 0


async def test_the_hermes_check_is_cached_for_a_few_seconds() -> None:
    now = [100.0]
    probe = FakeProbe()
    readiness = Readiness(probe, hermes_cache_s=5.0, clock=lambda: now[0])
    for _ in range(10):
        await readiness.evaluate()
    assert probe.hermes_calls == 1
    probe.hermes_ok = False
    now[0] += 4.9
    assert (await readiness.evaluate())["ready"] is True
    now[0] += 0.2
    assert (await readiness.evaluate())["ready"] is False
    assert probe.hermes_calls == 2


async def test_the_server_answers_health_ready_and_metrics() -> None:
    probe = FakeProbe()
    server = HealthServer(probe, Metrics(worker_id="w1"), port=0)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(server.url + "/health") as response:
                assert response.status == 200
            async with http.get(server.url + "/ready") as response:
                assert response.status == 200
                assert (await response.json())["hermes"] == {ENDPOINT: True}
            probe.redis_ok = False
            async with http.get(server.url + "/ready") as response:
                assert response.status == 503
                assert (await response.json())["checks"]["redis"] is False
            async with http.get(server.url + "/metrics") as response:
                assert response.status == 200
                assert "aip_hermes_worker_ready" in await response.text()
    finally:
        await server.stop()


# --- a running worker ------------------------------------------------------------------


@dataclass
class Running:
    """One worker process with its metrics port, and a signing publisher."""

    worker: WorkerProcess
    base_url: str
    client: AipClient


@pytest.fixture
async def running(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> AsyncIterator[Running]:
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    api_key, key_file = write_api_key_file(tmp_path)
    nc = await nats.connect(nats_server.url)
    try:
        await provision(nc.jetstream(), Subjects(), [ENDPOINT], StreamPolicy(ack_wait_s=3.0))
        async with FakeHermes(api_key=api_key, port=0) as fake:
            port = free_port()
            env = {
                "AIPD_NATS_URL": nats_server.url,
                "AIPD_REDIS_URL": redis_server.url,
                "AIPD_HERMES_ENDPOINTS": f"{ENDPOINT}={fake.url}",
                "AIPD_HERMES_API_KEY_FILE": str(key_file),
                "AIPD_LEASE_TTL_MS": "3000",
                "AIPD_SHUTDOWN_GRACE_S": "2",
                "AIPD_METRICS_PORT": str(port),
                **trust.environment(),
            }
            worker = WorkerProcess(worker_id="w-metrics", env=env, log_dir=tmp_path)
            await asyncio.to_thread(worker.start, wait_ready_s=30.0)
            try:
                yield Running(
                    worker, f"http://127.0.0.1:{port}", AipClient(nc, sign_key=trust.seed_file)
                )
            finally:
                await asyncio.to_thread(worker.kill)
    finally:
        await nc.close()


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
        return response.status, await response.text()


async def _until_status(
    http: aiohttp.ClientSession, url: str, status: int, timeout_s: float = 15.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        got, body = await _get(http, url)
        if got == status:
            document: dict[str, Any] = json.loads(body)
            return document
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} answered {got}, not {status}: {body}")
        await asyncio.sleep(0.2)


@pytest.mark.chaos
async def test_a_running_worker_reports_its_work_and_loses_readiness_without_redis(
    running: Running, redis_server: ServiceHandle
) -> None:
    base = running.base_url
    async with aiohttp.ClientSession() as http:
        assert (await _get(http, base + "/health"))[0] == 200
        ready = await _until_status(http, base + "/ready", 200)
        assert all(ready["checks"].values())
        assert ready["hermes"] == {ENDPOINT: True}

        action = running.client.build_action(
            endpoint_id=ENDPOINT,
            operation="models",
            input={},
            principal_id=USER_UNTENANTED,
            principal_kind=PRINCIPAL_KIND,
            authentication_issuer=ISSUER,
            credential_revision=REVISION,
        )
        result = await (await running.client.publish(action)).result(timeout_s=20)
        assert result.status is ResultStatus.COMPLETED
        p = "aip_hermes_worker"
        # The result is out before the delivery is acked and its slot given back: scrape
        # until the worker has nothing in flight, then every count of the Action is final.
        deadline = time.monotonic() + 5
        while True:
            _, text = await _get(http, base + "/metrics")
            if value(text, f"{p}_deliveries_total", endpoint=ENDPOINT, outcome="executed") and (
                value(text, f"{p}_in_flight", endpoint=ENDPOINT) == 0
            ):
                break
            assert time.monotonic() < deadline, text
            await asyncio.sleep(0.1)
        assert value(text, f"{p}_actions_total", capability=CAP, status="completed", code="") == 1
        assert value(text, f"{p}_deliveries_total", endpoint=ENDPOINT, outcome="executed") == 1
        assert (
            value(
                text,
                f"{p}_provider_responses_total",
                endpoint=ENDPOINT,
                method="GET",
                route="/v1/models",
                status="200",
            )
            >= 1
        )
        # `models` does not stream (as upstream AIP): its result is its whole answer, and no
        # chunk of any kind is counted for it.
        published = f"{p}_chunks_published_total"
        assert [key for key in samples(text) if key[0] == published] == [], text
        # A streaming capability's turn: its chunks are counted, one terminal among them.
        turn = running.client.build_action(
            endpoint_id=ENDPOINT,
            operation="chat_stream",
            input={"messages": [{"role": "user", "content": "a short streamed answer"}]},
            principal_id=USER_UNTENANTED,
            principal_kind=PRINCIPAL_KIND,
            authentication_issuer=ISSUER,
            credential_revision=REVISION,
        )
        result = await (await running.client.publish(turn)).result(timeout_s=20)
        assert result.status is ResultStatus.COMPLETED, result.error
        deadline = time.monotonic() + 5
        while True:
            _, text = await _get(http, base + "/metrics")
            executed = value(text, f"{p}_deliveries_total", endpoint=ENDPOINT, outcome="executed")
            if executed == 2 and value(text, f"{p}_in_flight", endpoint=ENDPOINT) == 0:
                break
            assert time.monotonic() < deadline, text
            await asyncio.sleep(0.1)
        assert value(text, published, endpoint=ENDPOINT, kind="done") == 1
        assert value(text, published, endpoint=ENDPOINT, kind="data") >= 1
        assert value(text, published, endpoint=ENDPOINT, kind="error") == 0

        await asyncio.to_thread(redis_server.stop)
        down = await _until_status(http, base + "/ready", 503)
        assert down["checks"] == {
            "nats_connected": True,
            "redis": False,
            "consumers_bound": True,
            "hermes": True,
            "serving": True,
            "jetstream_publish": True,
        }
        assert (await _get(http, base + "/health"))[0] == 200

        await asyncio.to_thread(redis_server.restart)
        await _until_status(http, base + "/ready", 200)


async def test_a_publish_failure_is_a_ready_reason_until_a_publish_is_stored() -> None:
    """`PublishHealth` (worker/bus/publish_health.py): the last failure names what
    JetStream answered; a stored publish clears it, and so does a quiet `window_s`."""
    from nats.js.errors import APIError

    from worker.bus.publish_health import PublishHealth

    now = [10.0]
    health = PublishHealth(window_s=30.0, clock=lambda: now[0])
    assert health.reason() is None
    health.failed(APIError(code=503, err_code=10077, description="no space left on device"))
    reason = health.reason()
    assert reason is not None
    assert "no space left on device" in reason
    assert "docs/operations.md" in reason
    health.succeeded()
    assert health.reason() is None
    health.failed(APIError(code=503, err_code=10076, description="jetstream not enabled"))
    reason = health.reason()
    assert reason is not None
    assert "restart nats-server" in reason
    now[0] += 31.0
    assert health.reason() is None
