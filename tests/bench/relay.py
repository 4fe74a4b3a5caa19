"""Figure 3: one run's provider events relayed to chunks, next to the raw publish rate.

Max rate: the fake floods one run with one-character `message.delta`s (256 frames per
write) and a JetStream pull consumer in the bench counts the chunks; the rate is chunks over
the time between the first and the last one received. The raw baselines publish the same
chunk bytes with `publish_async` (no SSE at all), and relay the same flood without leases.

Latency: the pacer offers 5,000 events/s on one run; each event carries the time it was
written, the chunk keeps it in its payload, and the consumer records when the chunk
arrived. This is "event written → chunk received", an upper bound of the relay's added
latency (it includes the loopback SSE hop).

Each max-rate run also records the CPU that nats-server and the counting consumer (this
process) spent per chunk over the same window. The flood, the relay, nats-server and the
consumer share the machine's two cores, so the rate is the whole machine's: when the
relay's own CPU per chunk rises, these two say whether the machine slowed down as a whole
(all three rise together) or the relay alone did.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas.ids import new_action_id
from tests.bench.env import ENDPOINT, Bench, Proc, cpu_s_of
from tests.bench.throughput import prepare, start_workers
from tests.bench.workload import publish_all
from worker.testing.fake_hermes import EventsFlood, FakeHermesControl

FLOOD_EVENTS = 30_000
#: The run's own events after the flood: two deltas, `reasoning.available`, `run.completed`.
OWN_EVENTS = 4
#: Provider events the relaying worker reads from one run (`AIPD_HERMES_OPERATOR_MAX_EVENTS`,
#: at its upper bound), and so the largest flood a run relays whole.
RUN_MAX_EVENTS = 100_000
MAX_FLOOD = RUN_MAX_EVENTS - OWN_EVENTS
#: The issue's offered rate, and one a saturated worker can still keep up with: past its
#: ceiling the latency is only the age of the backlog, which says nothing about the relay.
OFFERED_RATES = (5_000, 500)
LATENCY_SECONDS = 6
#: Chunks received in the first half second are left out of the latency percentiles: they
#: include the start of the run (admission, lease, claim, POST) queued behind the stream.
WARMUP_S = 0.5


@dataclass(frozen=True, slots=True)
class RelayRate:
    system: str
    chunks: int
    chunks_per_s: float
    cpu_us_per_chunk: float
    #: The bystanders' CPU per chunk over the same window (see the module docstring).
    nats_cpu_us_per_chunk: float
    consumer_cpu_us_per_chunk: float


class Bystanders:
    """CPU seconds that nats-server and this process spend between `start` and `stop`."""

    def __init__(self, bench: Bench) -> None:
        self.nats_pid = bench.nats_server.pid
        self.nats_s = self.consumer_s = 0.0

    def start(self) -> None:
        self.nats_s = cpu_s_of(self.nats_pid)
        self.consumer_s = time.process_time()

    def stop(self) -> None:
        self.nats_s = cpu_s_of(self.nats_pid) - self.nats_s
        self.consumer_s = time.process_time() - self.consumer_s

    def rate(self, system: str, received: int, rate: float, cpu_s: float) -> RelayRate:
        """The run's figures, each CPU in µs per chunk received."""
        per = 1e6 / received
        return RelayRate(system, received, rate, cpu_s * per, self.nats_s * per,
                         self.consumer_s * per)


@dataclass(frozen=True, slots=True)
class RelayLatency:
    system: str
    offered_per_s: float
    achieved_per_s: float
    p50_ms: float
    p99_ms: float


class ChunkConsumer:
    """A JetStream pull consumer on every chunk subject, recording arrival times."""

    def __init__(self, *, parse_timestamps: bool = False) -> None:
        self.arrivals: list[float] = []
        self.latencies_ms: list[tuple[float, float]] = []
        self.parse = parse_timestamps
        self.sample: bytes | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self, nc: Any) -> None:
        # The consumer is the measuring instrument, in the bench's own process, whose heap
        # (every module of the worker and the peers) a full GC walked for ~50 ms at a time:
        # a pause that delayed whichever relay was being measured. Frozen out, for both.
        gc.collect()
        gc.freeze()
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            f"aip.hermes.{ENDPOINT}.chunks.*",
            stream="AIP_HERMES_CHUNKS",
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.NEW),
        )
        self._task = asyncio.get_running_loop().create_task(self._run(sub))

    async def _run(self, sub: Any) -> None:
        decode = msgspec.json.decode
        while not self._stopping:
            try:
                msgs = await sub.fetch(256, timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):
                # nats-py may turn the cancellation of a pending fetch into a timeout, so
                # `stop()` also sets a flag this loop checks (a fig. 3 run once hung here).
                continue
            now = time.monotonic()
            wall = time.time()
            for msg in msgs:
                self.arrivals.append(now)
                if self.sample is None:
                    self.sample = msg.data
                if self.parse:
                    stamp = _chunk_payload(decode(msg.data)).get("timestamp")
                    if isinstance(stamp, float):
                        self.latencies_ms.append((now, (wall - stamp) * 1000))

    async def wait_count(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.arrivals) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.arrivals)} of {count} chunks arrived")
            await asyncio.sleep(0.05)

    def rate(self) -> float:
        if len(self.arrivals) < 2:
            return 0.0
        return (len(self.arrivals) - 1) / (self.arrivals[-1] - self.arrivals[0])

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5.0)


def _chunk_payload(document: Any) -> dict[str, Any]:
    """The provider payload of a chunk Envelope (docs/publishing.md "Reading chunks"):
    `data.hermes_sse.data`, or the value of `data.hermes_operator` / `data.hermes_worker`;
    a raw relay's own chunk-shaped messages carry it in `payload`; {} for anything else."""
    if not isinstance(document, dict):
        return {}
    if "body" not in document:
        payload = document.get("payload")
        return payload if isinstance(payload, dict) else {}
    data = ((document.get("body") or {}).get("stream_chunk") or {}).get("data")
    if not isinstance(data, dict) or len(data) != 1:
        return {}
    ((form, value),) = data.items()
    if form == "hermes_sse" and isinstance(value, dict):
        value = value.get("data")
    return value if isinstance(value, dict) else {}


async def ours_max_rate(bench: Bench, events: int = FLOOD_EVENTS) -> tuple[RelayRate, bytes]:
    """Our worker relaying one flooded operator run; returns a chunk sample for the raw runs."""
    envelopes = await prepare(bench, "ours", 1)
    procs = start_workers(bench, "ours", 1, AIPD_HERMES_OPERATOR_MAX_EVENTS=str(RUN_MAX_EVENTS))
    async with FakeHermesControl(bench.fake_url) as control:
        await control.add_faults(EventsFlood(count=events, times=1))
    nc = await nats.connect(bench.nats_url)
    consumer = ChunkConsumer()
    bystanders = Bystanders(bench)
    try:
        await consumer.start(nc)
        cpu0 = procs[0].cpu_s()
        bystanders.start()
        await publish_all(nc, bench.subjects.actions(ENDPOINT), envelopes)
        await consumer.wait_count(events + OWN_EVENTS, 60 + events / 500)
        cpu1 = procs[0].cpu_s()
        bystanders.stop()
    finally:
        await consumer.stop()
        await nc.close()
    bench.reap()
    assert consumer.sample is not None
    received = len(consumer.arrivals)
    return bystanders.rate("ours", received, consumer.rate(), cpu1 - cpu0), consumer.sample


async def raw_publish_rate(bench: Bench, sample: bytes, events: int = FLOOD_EVENTS) -> RelayRate:
    await bench.wipe()
    payload_file = bench.root / "chunk-sample.json"
    payload_file.write_bytes(sample)
    return await _raw(bench, "publish", events, [
        "--payload-file", str(payload_file), "--count", str(events)], bench.fake_url)


async def raw_relay_rate(bench: Bench, events: int = FLOOD_EVENTS) -> RelayRate:
    await bench.wipe()
    async with FakeHermesControl(bench.fake_url) as control:
        await control.add_faults(EventsFlood(count=events, times=1))
    return await _raw(bench, "relay", events, [], bench.fake_url)


async def _raw(bench: Bench, mode: str, events: int, extra: list[str], url: str) -> RelayRate:
    nc = await nats.connect(bench.nats_url)
    consumer = ChunkConsumer()
    bystanders = Bystanders(bench)
    try:
        await consumer.start(nc)
        bystanders.start()
        proc = bench.spawn(f"raw-{mode}", [
            sys.executable, "-m", "tests.bench.raw_relay", mode, "--nats-url", bench.nats_url,
            "--action-id", new_action_id(), "--hermes-url", url,
            "--api-key-file", str(bench.key_file), *extra], {})
        await asyncio.to_thread(proc.wait_for_log, f"raw {mode} done", 120.0)
        cpu = proc.cpu_s()
        await consumer.wait_count(events, 30)
        bystanders.stop()
    finally:
        await consumer.stop()
        await nc.close()
    bench.reap()
    received = len(consumer.arrivals)
    # The process CPU includes its start-up (imports, connect): an upper bound per chunk.
    return bystanders.rate(f"raw {mode}", received, consumer.rate(), cpu)


def _pacer(bench: Bench, rate: float, count: int) -> tuple[Proc, str]:
    proc = bench.spawn("pacer", [sys.executable, "-m", "tests.bench.pacer", "--rate", str(rate),
                                 "--count", str(count)], {})
    proc.wait_for_log("listening on", 20.0)
    return proc, proc.log_text().split("listening on", 1)[1].split()[0]


def _latency(system: str, rate: float, consumer: ChunkConsumer) -> RelayLatency:
    if not consumer.latencies_ms:
        raise RuntimeError(f"{system}: no timestamped chunk arrived")
    start = consumer.latencies_ms[0][0] + WARMUP_S
    values = [ms for at, ms in consumer.latencies_ms if at >= start]
    cuts = statistics.quantiles(values, n=100)
    return RelayLatency(system, rate, consumer.rate(), statistics.median(values), cuts[98])


async def ours_latency(bench: Bench, rate: float) -> RelayLatency:
    count = int(rate * LATENCY_SECONDS)
    envelopes = await prepare(bench, "ours", 1)
    _, url = _pacer(bench, rate, count)
    start_workers(bench, "ours", 1, AIPD_HERMES_OPERATOR_MAX_EVENTS=str(RUN_MAX_EVENTS),
                  AIPD_HERMES_ENDPOINTS=f"{ENDPOINT}={url}")
    nc = await nats.connect(bench.nats_url)
    consumer = ChunkConsumer(parse_timestamps=True)
    try:
        await consumer.start(nc)
        await publish_all(nc, bench.subjects.actions(ENDPOINT), envelopes)
        await consumer.wait_count(count, 60 + LATENCY_SECONDS * 4)
    finally:
        await consumer.stop()
        await nc.close()
    bench.reap()
    return _latency("ours", rate, consumer)


async def raw_relay_latency(bench: Bench, rate: float) -> RelayLatency:
    count = int(rate * LATENCY_SECONDS)
    await bench.wipe()
    _, url = _pacer(bench, rate, count)
    nc = await nats.connect(bench.nats_url)
    consumer = ChunkConsumer(parse_timestamps=True)
    try:
        await consumer.start(nc)
        bench.spawn("raw-relay", [
            sys.executable, "-m", "tests.bench.raw_relay", "relay", "--nats-url",
            bench.nats_url, "--action-id", new_action_id(), "--hermes-url", url], {})
        await consumer.wait_count(count, 60 + LATENCY_SECONDS * 4)
    finally:
        await consumer.stop()
        await nc.close()
    bench.reap()
    return _latency("raw relay", rate, consumer)
