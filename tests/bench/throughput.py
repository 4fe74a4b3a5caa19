"""Figures 1 and 2: Actions per second, CPU, Redis commands and HTTP requests per Action.

One measurement: wipe the servers, start the system's worker processes and wait until they
are ready, read every counter, offer N Actions at once, wait for the N-th completion, read
the counters again. Throughput is N over the time from the first publish to the last
completion; CPU is the kernel's user+system time of the worker processes between the two
reads (idle workers spend nothing measurable, so startup is excluded).

Redis is reported twice: commands the worker *sent* (counted in its own process, see
`tests.bench.counting`) and commands Redis *executed* on its behalf (`INFO commandstats`
deltas, which include every `redis.call` inside a Lua script, minus what the bench sent).
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import nats

from tests.bench import counting, require, sched
from tests.bench.counting import read_counts, script_names
from tests.bench.env import ENDPOINT, Bench, Proc, cpu_s_of
from tests.bench.workload import (
    PEER_SUBJECT,
    Completions,
    Envelope,
    approve_all,
    build_envelopes,
    provision_peer_stream,
    publish_all,
)

SYSTEMS = ("ours", "raw", "faststream", "arq")
#: Our worker with OpenTelemetry tracing on (`--otel`, figure 1 only): every span exported
#: over OTLP/HTTP to a sink in the bench process (docs/tracing.md#cost).
TRACED = "ours-otel"
OURS = ("ours", TRACED)
#: What a peer's worker process imports beyond the test suite (checked before it starts).
PEER_MODULES = {"faststream": ("faststream",), "arq": ("arq", "click")}
#: In-flight Actions per worker process, for every system (the raw loop's 100).
IN_FLIGHT = 100
_READY = {
    "ours": "bound to consumer",
    TRACED: "bound to consumer",
    "raw": "raw loop ready",
    "faststream": "faststream ready",
    "arq": "arq ready",
}


@dataclass(frozen=True, slots=True)
class Throughput:
    system: str
    workers: int
    actions: int
    seconds: float
    actions_per_s: float
    cpu_ms_per_action: float
    redis_sent_per_action: float
    redis_executed_per_action: float
    http_per_action: float
    #: Share of a core used by the servers and the bench while measuring (what else ran).
    nats_cpu: float
    redis_cpu: float
    fake_cpu: float
    bench_cpu: float
    #: Commands sent per Action by name; EVALSHA split by script (`evalsha:lease_acquire`).
    sent_breakdown: dict[str, float]
    #: The round of the session that measured it (1, 2, …; 0: measured on its own).
    round: int = 0
    #: Shares of each worker process's wall time on a CPU and runnable but waiting for one
    #: (`tests.bench.sched`; NaN where the kernel keeps no schedstats).
    on_cpu_share: float = math.nan
    waiting_share: float = math.nan


def start_workers(
    bench: Bench, system: str, count: int, *, first: int = 0, **extra: str
) -> list[Proc]:
    """Start `count` worker processes of `system` and wait until each is ready."""
    require(*PEER_MODULES.get(system, ()))
    procs = []
    for index in range(first, first + count):
        name = f"{system}-{index}"
        count_file = bench.root / f"{name}.counts"
        count_file.unlink(missing_ok=True)
        env = {counting.COUNT_FILE_ENV: str(count_file)}
        if system in OURS:
            settings = {
                "AIPD_WORKER_ID": name,
                "AIPD_CONCURRENCY": str(IN_FLIGHT),
                "AIPD_HERMES_MAX_CONCURRENT_RUNS": "1000",
                "AIPD_SHUTDOWN_GRACE_S": "5",
            }
            env |= bench.worker_env(**(settings | extra))
            argv = [sys.executable, "-m", "tests.bench.our_worker"]
        elif system == "raw":
            argv = [sys.executable, "-m", "tests.bench.raw_loop", "--nats-url", bench.nats_url,
                    "--redis-url", bench.redis_url, "--hermes-url", bench.fake_url,
                    "--api-key-file", str(bench.key_file), "--worker-id", name,
                    *(f"--{k.replace('_', '-')}={v}" for k, v in extra.items())]
        elif system == "faststream":
            argv = [sys.executable, "-m", "tests.bench.peer_faststream", "--nats-url",
                    bench.nats_url, "--hermes-url", bench.fake_url,
                    "--api-key-file", str(bench.key_file)]
        elif system == "arq":
            env |= {"BENCH_REDIS_URL": bench.redis_url, "BENCH_HERMES_URL": bench.fake_url,
                    "BENCH_HERMES_KEY": bench.api_key, **extra}
            argv = [sys.executable, "-m", "tests.bench.peer_arq"]
        else:
            raise ValueError(f"unknown system {system!r}")
        procs.append(bench.spawn(name, argv, env))
    for proc in procs:
        proc.wait_for_log(_READY[system], 30.0)
    return procs


async def prepare(bench: Bench, system: str, count: int, *, ack_wait_s: float = 30.0,
                  objective: str | None = None) -> list[Envelope]:
    """Wipe the servers and build (and, for us, approve) the Actions of one measurement."""
    await bench.wipe(ack_wait_s=ack_wait_s)
    if system in ("raw", "faststream"):
        await provision_peer_stream(
            bench, "bench_raw" if system == "raw" else "bench_fs", ack_wait_s=ack_wait_s
        )
    envelopes = build_envelopes(bench, count) if objective is None else build_envelopes(
        bench, count, objective
    )
    if system in OURS:
        await approve_all(bench, envelopes)
    return envelopes


async def offer(bench: Bench, system: str, nc: Any, envelopes: list[Envelope]) -> float:
    """Hand the Actions to the system; returns the monotonic time work could begin."""
    if system == "arq":
        return await enqueue_arq(bench, envelopes)
    subject = bench.subjects.actions(ENDPOINT) if system in OURS else PEER_SUBJECT
    started = time.monotonic()
    await publish_all(nc, subject, envelopes)
    return started


async def enqueue_arq(bench: Bench, envelopes: list[Envelope]) -> float:
    """Enqueue every job deferred to one instant, so the enqueue is not part of the window."""
    from arq import create_pool
    from arq.connections import RedisSettings

    pool = await create_pool(RedisSettings.from_dsn(bench.redis_url))
    lead_s = 1.0 + len(envelopes) / 3000
    release_wall = time.time() + lead_s
    release = time.monotonic() + lead_s
    from datetime import UTC, datetime

    when = datetime.fromtimestamp(release_wall, tz=UTC)
    gate = asyncio.Semaphore(64)

    async def one(envelope: Envelope) -> None:
        async with gate:
            await pool.enqueue_job(
                "run_action", envelope.payload, _job_id=envelope.action_id, _defer_until=when
            )

    try:
        await asyncio.gather(*(one(e) for e in envelopes))
    finally:
        await pool.aclose()
    if time.monotonic() > release:
        raise RuntimeError("arq enqueue took longer than its lead time; raise lead_s")
    return release


async def wait_arq_drained(bench: Bench, timeout_s: float) -> float:
    """Poll arq's queue until it is empty (a job leaves it only when it has finished)."""
    r = bench.redis()
    deadline = time.monotonic() + timeout_s
    try:
        while await r.zcard("arq:queue") > 0:
            if time.monotonic() > deadline:
                raise TimeoutError("arq queue not drained")
            await asyncio.sleep(0.02)
        return time.monotonic()
    finally:
        await r.aclose()


def _server_cpu(bench: Bench) -> tuple[float, float, float]:
    return cpu_s_of(bench.nats_server.pid), cpu_s_of(bench.redis_server.pid), bench.fake.cpu_s()


async def measure(
    bench: Bench,
    system: str,
    workers: int,
    count: int,
    *,
    otel: Mapping[str, str] | None = None,
) -> Throughput:
    envelopes = await prepare(bench, system, count)
    ids = {e.action_id for e in envelopes}
    # A traced worker gets the OTEL_* variables; every other system runs as before.
    procs = start_workers(bench, system, workers, **(otel or {} if system == TRACED else {}))
    nc = await nats.connect(bench.nats_url)
    try:
        completions = Completions()
        await completions.subscribe(nc)
        pids = [p.popen.pid if p.popen is not None else None for p in procs]
        cpu0 = sum(p.cpu_s() for p in procs)
        sched0 = sched.sched_times(pids)
        servers0 = _server_cpu(bench)
        bench0 = time.process_time()
        sent0 = sum(counting.sent.values())
        executed0 = await bench.redis_executed()
        http0 = await bench.http_counts()
        began = await offer(bench, system, nc, envelopes)
        timeout_s = 60 + count / 50
        if system == "arq":
            ended = await wait_arq_drained(bench, timeout_s)
        else:
            ended = await completions.wait_results(ids, timeout_s)
        cpu1 = sum(p.cpu_s() for p in procs)
        sched1 = sched.sched_times(pids)
        servers1 = _server_cpu(bench)
        bench1 = time.process_time()
        bench_sent = sum(counting.sent.values()) - sent0
        executed = await bench.redis_executed() - executed0 - bench_sent
        http1 = await bench.http_counts()
    finally:
        await nc.close()
    bench.reap()
    breakdown = sent_breakdown(bench, procs, count)
    sent = sum(breakdown.values()) * count
    seconds = ended - began
    http = sum(http1.values()) - sum(http0.values())
    # Over the measured run: the readings also hold the moments before it (arq's jobs wait
    # for their release instant), when a worker only polls, so shares are of `seconds`.
    on_cpu_share, waiting_share = sched.shares(sched0, sched1, seconds, len(procs))
    return Throughput(
        system=system,
        workers=workers,
        actions=count,
        seconds=seconds,
        actions_per_s=count / seconds,
        cpu_ms_per_action=(cpu1 - cpu0) * 1000 / count,
        redis_sent_per_action=sent / count,
        redis_executed_per_action=executed / count,
        http_per_action=http / count,
        nats_cpu=(servers1[0] - servers0[0]) / seconds,
        redis_cpu=(servers1[1] - servers0[1]) / seconds,
        fake_cpu=(servers1[2] - servers0[2]) / seconds,
        bench_cpu=(bench1 - bench0) / seconds,
        sent_breakdown=breakdown,
        on_cpu_share=on_cpu_share,
        waiting_share=waiting_share,
    )


def sent_breakdown(bench: Bench, procs: list[Proc], count: int) -> dict[str, float]:
    """Redis commands the workers sent per Action, EVALSHA named by script."""
    names = script_names()
    total: Counter[str] = Counter()
    for proc in procs:
        commands, scripts = read_counts(bench.root / f"{proc.name}.counts")
        commands.pop("EVALSHA", None)
        total.update(commands)
        for sha, calls in scripts.items():
            total[f"evalsha:{names.get(sha, sha[:8])}"] += calls
    return {name: calls / count for name, calls in total.most_common()}
