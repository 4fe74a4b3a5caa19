"""`python -m tests.bench`: run the figures and print them as Markdown tables.

    .venv/bin/python -m tests.bench                    # every figure, 3 runs (≈15 min)
    .venv/bin/python -m tests.bench --figures 1,3 --runs 1 --actions 300   # a quick look
    .venv/bin/python -m tests.bench --figures 1 --runs 1 --systems ours,raw --otel
                                                       # tracing's cost (`ours-otel`)
    .venv/bin/python -m tests.bench native             # the native AIP bindings' cost
                                                       # (tests/bench/native.py)

Figures 1-3 are repeated `--runs` times, systems interleaved inside each round so a noisy
minute hurts every system alike; the tables show medians, and figure 1's lead is also
printed round by round (`report.lead_by_round`). Figures 4 and 5 are driven by
timers (lease TTL, AckWait, job timeout) rather than by throughput and run `--slow-runs`
times. Raw results go to `results.json` in the session directory (printed at the end),
next to every process log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import signal
import sys
import time
from typing import Any

from tests.bench import counting, inflight, recovery, relay, report, throughput
from tests.bench.env import Bench
from tests.otel import otlp_receiver, traced


def _machine() -> str:
    import os

    import msgspec

    # The ceilings page's serialization case: how fast this CPU is compared with the machine
    # the peer figures were measured on (912k encodes/s there).
    sample = {"id": 1, "items": [{"sku": f"sku-{i}", "qty": i, "price": 9.99} for i in range(8)],
              "address": {"street": "Main St 1", "city": "Town", "zip": "12345"},
              "attrs": {f"k{i}": f"value-{i}" for i in range(8)}, "note": "x" * 300}
    began = time.perf_counter()
    for _ in range(100_000):
        msgspec.json.encode(sample)
    rate = 100_000 / (time.perf_counter() - began)
    load = os.getloadavg()
    return (f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, msgspec encode "
            f"{rate / 1000:.0f}k/s (ceilings machine: 912k/s), load average at start "
            f"{load[0]:.2f}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    figures = {int(f) for f in args.figures.split(",")}
    # `timeout` or `kill` ends a session with SIGTERM: as the main task's cancellation, so
    # the `finally` below stops the servers and workers (they run in sessions of their own
    # and would outlive an abrupt exit).
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGTERM, _cancel, asyncio.current_task()
    )
    bench = Bench.start()
    out: dict[str, Any] = {"machine": _machine(), "root": str(bench.root)}
    print(f"# bench session in {bench.root}\n{out['machine']}\n", flush=True)
    sinks = contextlib.AsyncExitStack()
    try:
        if figures & {1, 2}:
            counts = sorted(({1} if 1 in figures else set()) | ({2, 4} if 2 in figures else set()))
            results = []
            otel: dict[str, str] | None = None
            if args.otel:
                sink = await sinks.enter_async_context(otlp_receiver(decode=False))
                otel = traced(sink, "bench") | {"OTEL_BSP_SCHEDULE_DELAY": "1000"}
            for round_ in range(args.runs):
                for workers in counts:
                    traced_too = args.otel and workers == 1 and 1 in figures
                    systems = [s for s in throughput.SYSTEMS if s in args.systems.split(",")]
                    for system in (*systems, *((throughput.TRACED,) * traced_too)):
                        result = await throughput.measure(
                            bench, system, workers, args.actions, otel=otel
                        )
                        print(f"  round {round_ + 1} {system} x{workers}: "
                              f"{result.actions_per_s:,.0f} Actions/s", flush=True)
                        results.append(dataclasses.replace(result, round=round_ + 1))
            out["throughput"] = results
            print("\n## Figures 1-2: throughput\n" + report.throughput_table(results))
            print("\n" + report.lead_by_round(results))
            print("\nRedis commands our worker sends per Action (1 process):\n"
                  + report.breakdown_table(results) + "\n", flush=True)
        if 3 in figures:
            rates, latencies = [], []
            for _ in range(args.runs):
                ours, sample = await relay.ours_max_rate(bench, args.flood)
                rates += [ours, await relay.raw_publish_rate(bench, sample, args.flood),
                          await relay.raw_relay_rate(bench, args.flood)]
                for rate in relay.OFFERED_RATES:
                    latencies += [await relay.ours_latency(bench, rate),
                                  await relay.raw_relay_latency(bench, rate)]
            out["relay"] = {"rates": rates, "latencies": latencies}
            print("\n## Figure 3: chunk relay\n" + report.relay_tables(rates, latencies) + "\n",
                  flush=True)
        if 4 in figures:
            held = [await inflight.measure(bench, args.inflight, args.inflight_event_every,
                                           starve=args.starve)
                    for _ in range(args.slow_runs)]
            out["inflight"] = held
            starved = "" if args.starve is None else f" (worker starved to {args.starve:.0%})"
            print(f"\n## Figure 4: in-flight scale{starved}\n" + report.inflight_table(held)
                  + "\n", flush=True)
        if 5 in figures:
            recovered = []
            for _ in range(args.slow_runs):
                for system in throughput.SYSTEMS:
                    recovered.append(await recovery.measure(bench, system))
            out["recovery"] = recovered
            print("\n## Figure 5: recovery after kill -9\n" + report.recovery_table(recovered)
                  + "\n", flush=True)
    finally:
        await sinks.aclose()
        bench.close()
    return out


def _cancel(task: asyncio.Task[Any] | None) -> None:
    if task is not None:
        task.cancel()


def main() -> None:
    if sys.argv[1:2] == ["native"]:  # its own command: the native binding's figure
        from tests.bench import native

        native.main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument("--figures", default="1,2,3,4,5")
    parser.add_argument("--runs", type=int, default=3, help="repetitions of figures 1-3")
    parser.add_argument("--slow-runs", type=int, default=1, help="repetitions of figures 4-5")
    parser.add_argument("--actions", type=int, default=1000, help="Actions per throughput run")
    parser.add_argument("--systems", default=",".join(throughput.SYSTEMS),
                        help="the systems of figures 1-2 (a peer's extra may be missing)")
    parser.add_argument("--otel", action="store_true",
                        help="figure 1 also runs our worker with OpenTelemetry tracing on "
                             "(`ours-otel`, spans sent to a sink in the bench process)")
    parser.add_argument("--flood", type=int, default=10_000, help="events of the relay run")
    parser.add_argument("--inflight", type=int, default=inflight.RUNS,
                        help="runs figure 4 holds in one worker (at most 10,000)")
    parser.add_argument("--inflight-event-every", type=float, default=None, metavar="S",
                        help="seconds between two events of one held run (default: the "
                             "runs together send 1,000 events/s, at most one per 2 s each)")
    parser.add_argument("--starve", type=float, default=None, metavar="SHARE",
                        help="figure 4 with the worker overloaded: it runs only SHARE of "
                             "every 100 ms (SIGSTOP/SIGCONT), e.g. 0.35")
    args = parser.parse_args()
    if args.starve is not None and not 0.05 <= args.starve < 1:
        parser.error("--starve: a share of the time from 0.05 to under 1")
    if not 1 <= args.flood <= relay.MAX_FLOOD:
        parser.error(f"--flood: 1 to {relay.MAX_FLOOD:,} events (one run reads at most "
                     f"{relay.RUN_MAX_EVENTS:,}, {relay.OWN_EVENTS} of them its own)")
    counting.install()
    began = time.monotonic()
    try:
        out = asyncio.run(run(args))
    except asyncio.CancelledError:
        print("stopped by SIGTERM; its servers and workers are stopped", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
    path = f"{out['root']}/results.json"
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(out, handle, default=_plain, indent=1)
    print(f"results: {path} ({time.monotonic() - began:.0f} s)")


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(type(value))


if __name__ == "__main__":
    main()
