"""Figure 4: 10,000 slow operator runs held at once by one worker process.

The pacer serves runs that each emit an event every `event_every_s(runs)` seconds (1,000
events/s together, at most one every 2 s per run) for `RUN_S`. One worker (a
slot per run) takes the runs' Actions; once the pacer has seen every start the bench holds
them for a few heartbeat ticks and reads the worker's RSS (peak of 1 s samples), its Redis pipelines
(the heartbeat is the worker's only pipeline: round trips per tick = 1 + its SCRIPT EXISTS
preflights per tick), the leases it lost (its log) and AckWait expiries (`num_redelivered`
of the work consumers).

The operator admits at most 1,000 open runs per endpoint (`AIPD_HERMES_MAX_CONCURRENT_RUNS`
tops out at 1,000), so the runs are spread over as many endpoint ids as that takes (ten for
10,000), every one pointing at the one pacer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass

import nats

from tests.bench.counting import read_counts, read_pipelines, script_names
from tests.bench.env import Bench
from tests.bench.throughput import start_workers
from tests.bench.workload import approve_all, build_envelopes, publish_all

RUNS = 10_000
#: The operator's per-endpoint ceiling of open runs (`AIPD_HERMES_MAX_CONCURRENT_RUNS`).
PER_ENDPOINT = 1_000
#: The worker's own ceiling of slots (`AIPD_CONCURRENCY`).
MAX_SLOTS = 10_000
LEASE_TTL_MS = 15_000
HOLD_S = 16.0
#: Events per second all held runs send together, whatever their number: one event every
#: 2 s per run at 2,000 runs (the figure's earlier scale), one every 10 s at 10,000. The
#: figure measures holding runs (memory, heartbeats, leases); relaying is figure 3's.
EVENTS_PER_S = 1_000.0
#: No run sends more often than this, however few are held.
MIN_EVENT_EVERY_S = 2.0
#: How long each run lasts: longer than the longest ramp plus the hold.
RUN_S = 90.0
RAMP_LIMIT_S = 60.0


@dataclass(frozen=True, slots=True)
class InFlight:
    runs: int
    #: Events per second the held runs send together.
    events_per_s: float
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
    #: The share of the time the worker was let run (`--starve`; None: not starved).
    starved_to: float | None = None


def _pacer_started(url: str) -> int:
    with urllib.request.urlopen(f"{url}/_pacer/stats", timeout=5) as reply:  # noqa: S310
        return int(json.loads(reply.read())["started"])


def endpoint_ids(runs: int) -> tuple[str, ...]:
    """The fewest endpoint ids (`h1`, `h2`, …) whose capacity together admits `runs`."""
    return tuple(f"h{i + 1}" for i in range(max(1, -(-runs // PER_ENDPOINT))))


def event_every_s(runs: int) -> float:
    """Seconds between two events of one run, so that `runs` send EVENTS_PER_S together."""
    return max(MIN_EVENT_EVERY_S, runs / EVENTS_PER_S)


#: The duty cycle of a starved worker (`--starve`): short enough that no pause is a lease
#: matter by itself (a 65 ms stop is nothing to a 15 s TTL), long enough to be cheap.
STARVE_PERIOD_S = 0.1


async def _starve(pid: int, share: float) -> None:
    """Let the worker run `share` of every `STARVE_PERIOD_S` and stop it the rest
    (SIGSTOP/SIGCONT), until cancelled: a worker that gets far less CPU than its work needs,
    as under a noisy neighbour, whatever the machine's own speed. It is left running."""
    try:
        while True:
            os.kill(pid, signal.SIGCONT)
            await asyncio.sleep(STARVE_PERIOD_S * share)
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(STARVE_PERIOD_S * (1 - share))
    except ProcessLookupError:
        return
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


async def measure(
    bench: Bench, runs: int = RUNS, every_s: float | None = None, *, starve: float | None = None
) -> InFlight:
    """Hold `runs` slow runs in one worker; each sends an event every `every_s` seconds
    (default: `event_every_s(runs)`). `starve`: the worker runs only that share of every
    `STARVE_PERIOD_S` (an overloaded worker, `_starve`)."""
    if runs > MAX_SLOTS:
        raise ValueError(f"one worker holds at most {MAX_SLOTS:,} runs (AIPD_CONCURRENCY)")
    endpoints = endpoint_ids(runs)
    await bench.wipe(ack_wait_s=LEASE_TTL_MS / 1000, endpoints=endpoints)
    every_s = event_every_s(runs) if every_s is None else every_s
    pacer = bench.spawn("pacer-slow", [
        sys.executable, "-m", "tests.bench.pacer", "--rate", str(1 / every_s),
        "--count", str(max(1, round(RUN_S / every_s)))], {})
    pacer.wait_for_log("listening on", 20.0)
    url = pacer.log_text().split("listening on", 1)[1].split()[0]
    # Runs dealt out as evenly as the endpoints allow (each gets at most PER_ENDPOINT).
    share, extra = divmod(runs, len(endpoints))
    batches = {e: build_envelopes(bench, share + (i < extra), endpoint=e)
               for i, e in enumerate(endpoints)}
    for envelopes in batches.values():
        await approve_all(bench, envelopes)
    worker = start_workers(
        bench, "ours", 1,
        AIPD_HERMES_ENDPOINTS=",".join(f"{e}={url}" for e in endpoints),
        AIPD_HERMES_SHARE_API_KEY="true",  # every endpoint is the one pacer server
        AIPD_CONCURRENCY=str(min(MAX_SLOTS, runs + 100)),
        AIPD_LEASE_TTL_MS=str(LEASE_TTL_MS),
        AIPD_SHUTDOWN_GRACE_S="1",
    )[0]
    idle_rss = worker.rss_mb()
    nc = await nats.connect(bench.nats_url)
    starving = (
        asyncio.get_running_loop().create_task(_starve(worker.pid, starve))
        if starve is not None
        else None
    )
    try:
        began = time.monotonic()
        for endpoint, envelopes in batches.items():
            await publish_all(nc, bench.subjects.actions(endpoint), envelopes)
        # A worker that cannot hold them all is a result too: report how many it started.
        started = 0
        shown_at, cpu_at = began, worker.cpu_s()
        while started < runs and time.monotonic() - began < RAMP_LIMIT_S:
            await asyncio.sleep(0.5)
            started = await asyncio.to_thread(_pacer_started, url)
            if time.monotonic() - shown_at >= 5.0:  # the ramp's shape, for the log
                now, cpu = time.monotonic(), worker.cpu_s()
                print(f"  ramp: {started:,} started after {now - began:.1f} s, worker CPU "
                      f"{(cpu - cpu_at) / (now - shown_at):.0%}, RSS {worker.rss_mb():.0f} MB",
                      flush=True)
                shown_at, cpu_at = now, cpu
        ramp_s = time.monotonic() - began
        peak = worker.rss_mb()
        hold_until = time.monotonic() + HOLD_S
        while time.monotonic() < hold_until:
            await asyncio.sleep(1.0)
            peak = max(peak, worker.rss_mb())
        js = nc.jetstream()
        redelivered = 0
        for endpoint in endpoints:
            info = await js.consumer_info(
                bench.subjects.stream_name("actions"), bench.subjects.durable(endpoint, "actions")
            )
            redelivered += info.num_redelivered
    finally:
        if starving is not None:
            starving.cancel()
            await asyncio.gather(starving, return_exceptions=True)
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
        events_per_s=runs / every_s,
        started=started,
        ramp_s=ramp_s,
        peak_rss_mb=peak,
        rss_kib_per_run=(peak - idle_rss) * 1024 / runs,
        ticks=ticks,
        round_trips_per_tick=(ticks + commands.get("SCRIPT EXISTS", 0)) / ticks,
        renewals_per_tick=renewals / ticks,
        leases_lost=lost,
        ackwait_expiries=redelivered,
        starved_to=starve,
    )
