"""Figure 4: 2,000 slow operator runs held at once by one worker process.

The pacer serves runs that emit one event every two seconds for a minute. One worker (2,100
slots) takes 2,000 Actions; once the pacer has seen 2,000 starts the bench holds them for a
few heartbeat ticks and reads the worker's RSS (peak of 1 s samples), its Redis pipelines
(the heartbeat is the worker's only pipeline: round trips per tick = 1 + its SCRIPT EXISTS
preflights per tick), the leases it lost (its log) and AckWait expiries (`num_redelivered`
of the work consumers).

The operator admits at most 1,000 open runs per endpoint (`AIPD_HERMES_MAX_CONCURRENT_RUNS`
tops out at 1,000), so the 2,000 runs are spread over two endpoint ids that both point at
the pacer.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from dataclasses import dataclass

import nats

from tests.bench.counting import read_counts, read_pipelines, script_names
from tests.bench.env import Bench
from tests.bench.throughput import start_workers
from tests.bench.workload import approve_all, build_envelopes, publish_all

RUNS = 2_000
ENDPOINTS = ("h1", "h2")
LEASE_TTL_MS = 15_000
HOLD_S = 16.0
EVENT_EVERY_S = 2.0
RUN_EVENTS = 40
RAMP_LIMIT_S = 60.0


@dataclass(frozen=True, slots=True)
class InFlight:
    runs: int
    #: Runs the pacer saw started (< runs when the worker could not take them all).
    started: int
    ramp_s: float
    peak_rss_mb: float
    rss_kib_per_run: float
    ticks: int
    round_trips_per_tick: float
    renewals_per_tick: float
    leases_lost: int
    ackwait_expiries: int


def _pacer_started(url: str) -> int:
    with urllib.request.urlopen(f"{url}/_pacer/stats", timeout=5) as reply:  # noqa: S310
        return int(json.loads(reply.read())["started"])


async def measure(bench: Bench, runs: int = RUNS) -> InFlight:
    await bench.wipe(ack_wait_s=LEASE_TTL_MS / 1000, endpoints=ENDPOINTS)
    pacer = bench.spawn("pacer-slow", [
        sys.executable, "-m", "tests.bench.pacer", "--rate", str(1 / EVENT_EVERY_S),
        "--count", str(RUN_EVENTS)], {})  # 80 s runs: longer than the ramp and the hold
    pacer.wait_for_log("listening on", 20.0)
    url = pacer.log_text().split("listening on", 1)[1].split()[0]
    per_endpoint = runs // len(ENDPOINTS)
    batches = {e: build_envelopes(bench, per_endpoint, endpoint=e) for e in ENDPOINTS}
    for envelopes in batches.values():
        await approve_all(bench, envelopes)
    worker = start_workers(
        bench, "ours", 1,
        AIPD_HERMES_ENDPOINTS=",".join(f"{e}={url}" for e in ENDPOINTS),
        AIPD_HERMES_SHARE_API_KEY="true",  # every endpoint is the one pacer server
        AIPD_CONCURRENCY=str(runs + 100),
        AIPD_LEASE_TTL_MS=str(LEASE_TTL_MS),
        AIPD_SHUTDOWN_GRACE_S="1",
    )[0]
    idle_rss = worker.rss_mb()
    nc = await nats.connect(bench.nats_url)
    try:
        began = time.monotonic()
        for endpoint, envelopes in batches.items():
            await publish_all(nc, bench.subjects.actions(endpoint), envelopes)
        # A worker that cannot hold them all is a result too: report how many it started.
        started = 0
        while started < runs and time.monotonic() - began < RAMP_LIMIT_S:
            await asyncio.sleep(0.5)
            started = await asyncio.to_thread(_pacer_started, url)
        ramp_s = time.monotonic() - began
        peak = worker.rss_mb()
        hold_until = time.monotonic() + HOLD_S
        while time.monotonic() < hold_until:
            await asyncio.sleep(1.0)
            peak = max(peak, worker.rss_mb())
        js = nc.jetstream()
        redelivered = 0
        for endpoint in ENDPOINTS:
            info = await js.consumer_info(
                bench.subjects.stream_name("actions"), bench.subjects.durable(endpoint, "actions")
            )
            redelivered += info.num_redelivered
    finally:
        await nc.close()
    lost = worker.log_text().count("lease lost for")
    bench.reap(timeout_s=90.0)
    counts_file = bench.root / f"{worker.name}.counts"
    pipelines = read_pipelines(counts_file)
    commands, scripts = read_counts(counts_file)
    names = script_names()
    renewals = sum(n for sha, n in scripts.items() if names.get(sha) == "lease_renew")
    ticks = max(1, pipelines.get("executions", 0))
    return InFlight(
        runs=runs,
        started=started,
        ramp_s=ramp_s,
        peak_rss_mb=peak,
        rss_kib_per_run=(peak - idle_rss) * 1024 / runs,
        ticks=ticks,
        round_trips_per_tick=(ticks + commands.get("SCRIPT EXISTS", 0)) / ticks,
        renewals_per_tick=renewals / ticks,
        leases_lost=lost,
        ackwait_expiries=redelivered,
    )
