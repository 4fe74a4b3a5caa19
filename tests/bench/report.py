"""Medians, ratios and Markdown tables: what the runner prints and BENCHMARKS.md records."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tests.bench.inflight import InFlight
from tests.bench.recovery import Recovery
from tests.bench.relay import RelayLatency, RelayRate
from tests.bench.throughput import Throughput

T = TypeVar("T")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---:" if i else "---" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def median_of(samples: Sequence[T], field: str) -> float:
    return float(statistics.median(float(getattr(s, field)) for s in samples))


def throughput_table(results: Sequence[Throughput]) -> str:
    """One row per (system, workers): medians, and ratios to raw and to the best peer."""
    groups: dict[tuple[str, int], list[Throughput]] = {}
    for result in results:
        groups.setdefault((result.system, result.workers), []).append(result)

    def med(system: str, workers: int, field: str) -> float:
        samples = groups.get((system, workers))
        return median_of(samples, field) if samples else float("nan")

    rows = []
    for (system, workers), samples in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rate = median_of(samples, "actions_per_s")
        raw = med("raw", workers, "actions_per_s")
        peer = max(
            med("arq", workers, "actions_per_s"), med("faststream", workers, "actions_per_s")
        )
        rows.append([
            system, workers, len(samples), rate, rate / raw, rate / peer,
            median_of(samples, "cpu_ms_per_action"),
            median_of(samples, "redis_sent_per_action"),
            median_of(samples, "redis_executed_per_action"),
            median_of(samples, "http_per_action"),
            f"{median_of(samples, 'nats_cpu'):.2f}/{median_of(samples, 'redis_cpu'):.2f}/"
            f"{median_of(samples, 'fake_cpu'):.2f}",
            _percentages(samples, "on_cpu_share", "waiting_share"),
        ])
    return table(
        ["system", "procs", "runs", "Actions/s", "x raw", "x best peer", "CPU ms/Action",
         "Redis sent/Action", "Redis executed/Action", "HTTP/Action", "cores nats/redis/fake",
         "% on a CPU/waiting"],
        rows,
    )


def _percentages(samples: Sequence[Throughput], *fields: str) -> str:
    """Medians of shares as whole percentages, `a/b`; `-` where one was not measured."""
    values = [median_of(samples, field) for field in fields]
    if any(math.isnan(value) for value in values):
        return "-"
    return "/".join(f"{value * 100:.0f}" for value in values)


def lead_by_round(results: Sequence[Throughput], system: str = "ours") -> str:
    """`system`'s rate over the best peer's of the same round, one ratio per round.

    The table's "x best peer" divides two medians taken over different rounds. The systems
    of one round run minutes apart, so they share the machine's state (a noisy neighbour,
    a slow phase), which moves every system's rate by a quarter or more between rounds
    here: the ratio within a round keeps the pairing that the interleaving is there for.
    Both are printed; neither replaces the other."""
    rounds: dict[tuple[int, int], dict[str, float]] = {}
    for result in results:
        if result.round:
            rounds.setdefault((result.workers, result.round), {})[result.system] = (
                result.actions_per_s
            )
    ratios: dict[int, list[float]] = {}
    for (workers, _), rates in sorted(rounds.items()):
        peers = [rates[peer] for peer in ("arq", "faststream") if peer in rates]
        if system in rates and peers:
            ratios.setdefault(workers, []).append(rates[system] / max(peers))
    if not ratios:
        return f"(no round measured {system} beside a peer)"
    lines = []
    for workers, per_round in sorted(ratios.items()):
        listed = ", ".join(f"{ratio:.2f}" for ratio in per_round)
        lines.append(
            f"{system} x{workers} / the best peer of the same round: median "
            f"{statistics.median(per_round):.2f}x over {len(per_round)} round(s) ({listed})"
        )
    return "\n".join(lines)


def breakdown_table(results: Sequence[Throughput], system: str = "ours") -> str:
    ours = [r for r in results if r.system == system and r.workers == 1]
    if not ours:
        return ""
    names = sorted({n for r in ours for n in r.sent_breakdown},
                   key=lambda n: -statistics.median(r.sent_breakdown.get(n, 0.0) for r in ours))
    return table(["command sent", "per Action (median)"],
                 [[n, statistics.median(r.sent_breakdown.get(n, 0.0) for r in ours)]
                  for n in names])


def relay_tables(rates: Sequence[RelayRate], latencies: Sequence[RelayLatency]) -> str:
    by_system: dict[str, list[RelayRate]] = {}
    for rate in rates:
        by_system.setdefault(rate.system, []).append(rate)
    raw = by_system.get("raw publish")
    raw_rate = median_of(raw, "chunks_per_s") if raw else float("nan")
    rate_rows = [[system, len(s), median_of(s, "chunks_per_s"),
                  median_of(s, "chunks_per_s") / raw_rate, median_of(s, "cpu_us_per_chunk"),
                  median_of(s, "nats_cpu_us_per_chunk"), median_of(s, "consumer_cpu_us_per_chunk")]
                 for system, s in by_system.items()]
    by_case: dict[tuple[str, float], list[RelayLatency]] = {}
    for latency in latencies:
        by_case.setdefault((latency.system, latency.offered_per_s), []).append(latency)
    latency_rows = [[system, offered, len(s), median_of(s, "achieved_per_s"),
                     median_of(s, "p50_ms"), median_of(s, "p99_ms")]
                    for (system, offered), s in sorted(
                        by_case.items(), key=lambda kv: (-kv[0][1], kv[0][0]))]
    return (
        table(["relay", "runs", "chunks/s", "x raw publish", "CPU us/chunk",
               "nats-server us/chunk", "consumer us/chunk"], rate_rows)
        + "\n\n"
        + table(["relay", "offered/s", "runs", "achieved/s", "p50 ms", "p99 ms"], latency_rows)
    )


def inflight_table(results: Sequence[InFlight]) -> str:
    rows = [[r.runs, r.events_per_s, r.started, r.ramp_s, r.peak_rss_mb, r.rss_kib_per_run,
             r.ticks, r.round_trips_per_tick, r.renewals_per_tick, r.leases_lost,
             r.ackwait_expiries] for r in results]
    return table(["runs", "events/s", "started", "ramp s", "peak RSS MB", "KiB/run",
                  "heartbeat ticks", "round trips/tick", "renewals/tick", "leases lost",
                  "AckWait expiries"], rows)


def recovery_table(results: Sequence[Recovery]) -> str:
    groups: dict[str, list[Recovery]] = {}
    for result in results:
        groups.setdefault(result.system, []).append(result)
    pick: Callable[[list[Recovery], str], float] = median_of
    rows = [[system, len(s), pick(s, "in_flight"), pick(s, "reowned"), pick(s, "p50_s"),
             pick(s, "max_s"), s[0].timer_s, pick(s, "duplicate_starts")]
            for system, s in groups.items()]
    return table(["system", "runs", "in flight", "re-owned", "p50 s", "max s", "timer s",
                  "duplicate POST /v1/runs"], rows)
