"""Figure 5: kill -9 the worker that owns 100 in-flight runs; how long until each is owned
again and publishing, and how many `POST /v1/runs` were sent twice.

The victim starts alone and takes all 100 slow Actions (the fake holds every stream frame
back, so a run lasts about 8 s); once the fake has seen 100 starts a standby worker starts,
and the victim is killed. Evidence that an Action has a new owner, per Action, is the first
of: a chunk or result published after the kill, a `POST /v1/runs` for it after the kill
(the peers start the run again), and for our worker its lease taken at a higher fence.
Duplicate starts come from the fake's request log (one session id per Action).

Timers are the same 10 s for everyone so a run fits the time budget: our lease TTL, the
peers' AckWait (the raw loop's lease too) and arq's job timeout (its orphan waits for the
job timeout + 10 s: with the default 300 s timeout that is 310 s). The peers' AckWait must
outlast their longest job, since they send no progress; ours heartbeats, so a shorter TTL
would work for it but not for them.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

import nats

from tests.bench.env import Bench, Proc
from tests.bench.throughput import offer, prepare, start_workers, wait_arq_drained
from tests.bench.workload import SLOW_OBJECTIVE, Completions
from worker.store.keys import ActionKeys
from worker.testing.fake_hermes import EventsSlow, FakeHermesControl

IN_FLIGHT_RUNS = 100
TIMER_S = 10.0
ARQ_JOB_TIMEOUT_S = 10
FRAME_DELAY_S = 0.1
SETTLE_S = 40.0


@dataclass(frozen=True, slots=True)
class Recovery:
    system: str
    in_flight: int
    reowned: int
    p50_s: float
    max_s: float
    duplicate_starts: int
    timer_s: float


def _timers(system: str) -> dict[str, str]:
    if system == "ours":
        return {"AIPD_LEASE_TTL_MS": str(int(TIMER_S * 1000)),
                "AIPD_HERMES_OPERATOR_MAX_EVENTS": "100000"}
    if system == "arq":
        return {"BENCH_ARQ_JOB_TIMEOUT_S": str(ARQ_JOB_TIMEOUT_S)}
    if system == "raw":
        return {"lease_ttl_ms": str(int(TIMER_S * 1000))}
    return {}


async def _wait_starts(bench: Bench, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (await bench.http_counts()).get("POST /v1/runs", 0) < count:
        if time.monotonic() > deadline:
            raise TimeoutError("the victim did not start every run")
        await asyncio.sleep(0.1)


async def measure(bench: Bench, system: str) -> Recovery:
    envelopes = await prepare(bench, system, IN_FLIGHT_RUNS, ack_wait_s=TIMER_S,
                              objective=SLOW_OBJECTIVE)
    ids = [e.action_id for e in envelopes]
    async with FakeHermesControl(bench.fake_url) as control:
        await control.add_faults(EventsSlow(delay_s=FRAME_DELAY_S, times=None))
    timers = _timers(system)
    victim = start_workers(bench, system, 1, **timers)[0]
    nc = await nats.connect(bench.nats_url)
    completions = Completions()
    try:
        await completions.subscribe(nc, chunks=True)
        await offer(bench, system, nc, envelopes)
        await _wait_starts(bench, IN_FLIGHT_RUNS, 60)
        standby = _start_standby(bench, system, timers)
        finished_before = set(completions.results)
        killed_at_wall = time.time()
        killed_at = time.monotonic()
        victim.kill()
        evidence = await _watch(bench, system, ids, killed_at, killed_at_wall, completions)
        # Let every Action finish before counting starts, so a late duplicate is counted.
        if system == "arq":
            await wait_arq_drained(bench, SETTLE_S)
        else:
            await completions.wait_results(set(ids), SETTLE_S)
    finally:
        await nc.close()
    bench.reap()
    del standby
    in_flight = [i for i in ids if i not in finished_before]
    delays = [evidence[i] for i in in_flight if i in evidence]
    async with FakeHermesControl(bench.fake_url) as control:
        posts = await control.requests("POST /v1/runs")
    sessions = [str((p.body or {}).get("session_id", "")) for p in posts]
    duplicates = sum(max(0, sessions.count(f"aip-operator-{i}") - 1) for i in ids)
    return Recovery(
        system=system,
        in_flight=len(in_flight),
        reowned=len(delays),
        p50_s=statistics.median(delays) if delays else float("nan"),
        max_s=max(delays) if delays else float("nan"),
        duplicate_starts=duplicates,
        timer_s=float(ARQ_JOB_TIMEOUT_S + 10 if system == "arq" else TIMER_S),
    )


def _start_standby(bench: Bench, system: str, timers: dict[str, str]) -> Proc:
    # A second process of the same system, named apart from the victim (its own log).
    return start_workers(bench, system, 1, first=1, **timers)[0]


async def _watch(
    bench: Bench,
    system: str,
    ids: list[str],
    killed_at: float,
    killed_at_wall: float,
    completions: Completions,
) -> dict[str, float]:
    """Seconds from the kill to the first sign of a new owner, per Action."""
    evidence: dict[str, float] = {}
    r = bench.redis()
    deadline = killed_at + SETTLE_S + (ARQ_JOB_TIMEOUT_S + 10 if system == "arq" else 0)
    # Chunks the victim published just before it died are still reaching the bench for a
    # moment; no system re-owns within a second (every timer here is 10 s or more).
    grace = 1.0
    try:
        while len(evidence) < len(ids) and time.monotonic() < deadline:
            for action_id in ids:
                if action_id in evidence:
                    continue
                seen = [at for at, _ in completions.chunks.get(action_id, [])
                        if at > killed_at + grace]
                result = completions.results.get(action_id)
                if result is not None and result > killed_at + grace:
                    seen.append(result)
                if seen:
                    evidence[action_id] = min(seen) - killed_at
            if system == "ours":
                for action_id in ids:
                    if action_id not in evidence:
                        fence = await r.hget(ActionKeys.of(action_id).lease, "fence")
                        if fence is not None and int(fence) > 1:
                            evidence[action_id] = time.monotonic() - killed_at
            async with FakeHermesControl(bench.fake_url) as control:
                posts = await control.requests("POST /v1/runs")
            for post in posts:
                session = str((post.body or {}).get("session_id", ""))
                action_id = session.removeprefix("aip-operator-")
                if post.at > killed_at_wall and action_id not in evidence and action_id in ids:
                    evidence[action_id] = post.at - killed_at_wall
            await asyncio.sleep(0.1)
    finally:
        await r.aclose()
    return evidence
