"""`python -m tests.chaos --minutes N --seed S [--mutation M]` (also `./dev chaos ...`).

Runs campaigns of `--schedule-s` seconds each (seeds S, S+1, ...) until `--minutes` of
wall time have passed, prints one summary line per campaign and, for a campaign with a
violation, the seed, the fault schedule and the history around it. Exit status 1 when any
campaign found a violation, 2 when no nats-server the project accepts is installed (or, with
`--hermes real`, when the real Hermes cannot be installed or started).

`--hermes real` runs the smaller real-Hermes campaign (hermes-agent 0.19.0 behind a
recording proxy, two workers, the `REAL` schedule shape; docs/reliability.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections import Counter

from tests.chaos.campaign import run_campaign
from tests.chaos.deployment import NO_DURABLE_NATS, durable_nats_server
from tests.chaos.launcher import MUTATIONS
from tests.chaos.nemesis import KINDS
from worker.testing._errors import HermesUnavailable

#: Seconds of faults and workload per campaign, by Hermes (the real one's is smaller).
SCHEDULE_S = {"fake": 60.0, "real": 40.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="total wall time")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument(
        "--hermes",
        choices=sorted(SCHEDULE_S),
        default="fake",
        help="the fake Hermes (default), or the real hermes-agent 0.19.0 (a smaller campaign)",
    )
    parser.add_argument(
        "--schedule-s",
        type=float,
        default=None,
        help="seconds of faults and workload per campaign (default: 60, with --hermes real 40)",
    )
    parser.add_argument(
        "--mutation",
        choices=sorted(MUTATIONS),
        default=None,
        help="plant a bug (to see the checker find it)",
    )
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"fault kinds to inject, comma-separated (default: all: {','.join(KINDS)})",
    )
    parser.add_argument("--keep", action="store_true", help="keep each campaign's directory")
    parser.add_argument("--stop-on-violation", action="store_true")
    args = parser.parse_args(argv)
    if durable_nats_server() is None:
        print(f"skipped: {NO_DURABLE_NATS}", file=sys.stderr)
        return 2
    # The fake Hermes logs every request a partition or a kill cut short; the campaign's
    # history already has what matters.
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)
    deadline = time.monotonic() + args.minutes * 60
    seed = args.seed
    total_faults: Counter[str] = Counter()
    operations = violations = known = campaigns = late = retracted = 0
    schedule_s = args.schedule_s if args.schedule_s is not None else SCHEDULE_S[args.hermes]
    while time.monotonic() < deadline:
        try:
            report = asyncio.run(
                run_campaign(
                    seed,
                    schedule_s,
                    mutation=args.mutation,
                    keep=args.keep,
                    kinds=tuple(k for k in args.kinds.split(",") if k),
                    hermes=args.hermes,
                )
            )
        except HermesUnavailable as exc:
            print(f"skipped: the real Hermes is unavailable: {exc.reason}", file=sys.stderr)
            return 2
        campaigns += 1
        operations += report.operations
        total_faults.update(report.injected)
        violations += len(report.unknown)
        known += len(report.violations) - len(report.unknown)
        late, retracted = late + report.late_chunks, retracted + report.retracted
        if report.violations:
            print(report.explain(), flush=True)
        else:
            print(report.summary(), flush=True)
        print(f"  reached Hermes: {report.traffic()}", flush=True)
        if report.unknown:
            if report.root is not None:
                print(f"history: {report.root / 'history.jsonl'}", flush=True)
            if args.stop_on_violation:
                break
        seed += 1
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(total_faults.items()))
    print(
        f"total: {campaigns} campaigns ({args.hermes} Hermes) from seed {args.seed}, "
        f"{operations} operations, "
        f"{sum(total_faults.values())} faults ({kinds}), {violations} violations"
        f" (+{known} of known bugs); {late} late chunks kept from the consumer by the reader"
        f" ({retracted} retracted after being streamed)",
        flush=True,
    )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
