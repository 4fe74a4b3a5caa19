"""The zero-latency fake Hermes every benchmark talks to, as its own process on uvloop.

`python -m tests.bench.fake_server --port 0 --api-key-file F` takes the fake's own flags; the
defaults here are the benchmark's: no agent build delay, no run cap in practice (the fake
must never be the 429 that limits a system), and uvloop, so the server spends as little of
the two shared cores as it can. It prints `listening on URL` like the fake's own entry point.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop

from worker.testing.fake_hermes.__main__ import main

#: Defaults that make the fake answer at once and never refuse a run.
BENCH_FLAGS = ["--build-delay-s", "0", "--max-concurrent-runs", "1000000"]


if __name__ == "__main__":
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    main([*BENCH_FLAGS, *sys.argv[1:]])
