"""`python -m tests.bench.peer_faststream`: the FastStream peer (NATS JetStream, no Redis).

A concurrent pull subscriber (`max_workers=100`) on a durable consumer of the peers' job
stream; the handler does the HTTP part and publishes every chunk and the result to
JetStream with an awaited `publish`, as a FastStream user would write it, then FastStream
acks. No lease, no fence, no stored result: the weaker guarantee the tables compare against.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

import uvloop
from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub

from tests.bench import counting
from tests.bench.http_job import (
    ChunkChain,
    follow_run,
    job_of_value,
    new_client,
    result_bytes,
    start_run,
)

IN_FLIGHT = 100


def build_app(args: argparse.Namespace) -> FastStream:
    # Per-message access logs at DEBUG (not shown), as arq's per-job lines are not shown
    # either. Our worker writes one `settled` line per Action; figure 1 with that line
    # silenced was the same within its noise (BENCHMARKS.md, 2026-12-06 evening).
    broker = NatsBroker(args.nats_url, log_level=logging.DEBUG)
    http = new_client(args.hermes_url, Path(args.api_key_file).read_text().strip())
    worker_id = f"faststream-{os.getpid()}"
    js = broker

    @broker.subscriber(
        "bench.jobs",
        stream=JStream(args.stream, declare=False),
        durable=args.durable,
        pull_sub=PullSub(batch_size=IN_FLIGHT, timeout=1.0),
        max_workers=IN_FLIGHT,
        ack_policy=AckPolicy.ACK,
    )
    async def handle(body: dict[str, Any]) -> None:
        # FastStream decodes the JSON body itself, as its users let it.
        job = job_of_value(body)
        run_id = await start_run(http, job)
        chain = ChunkChain(job.id, run_id)

        async def on_event(event: dict[str, Any]) -> None:
            kind = "done" if event.get("event") == "run.completed" else "data"
            await js.publish(
                chain.next(kind, event),
                f"aip.hermes.h1.chunks.{job.id}",
                stream="AIP_HERMES_CHUNKS",
            )

        terminal = await follow_run(http, run_id, on_event)
        status = "completed" if terminal == "run.completed" else "failed"
        await js.publish(
            result_bytes(job.id, status, worker_id, 0, chain.last),
            f"aip.hermes.h1.results.{job.id}",
            stream="AIP_HERMES_RESULTS",
        )

    app = FastStream(broker)

    @app.after_startup
    async def ready() -> None:
        print("faststream ready", flush=True)

    @app.after_shutdown
    async def close_http() -> None:
        await http.aclose()

    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.peer_faststream")
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--hermes-url", required=True)
    parser.add_argument("--api-key-file", required=True)
    parser.add_argument("--stream", default="BENCH_JOBS")
    parser.add_argument("--durable", default="bench_fs")
    args = parser.parse_args()
    counting.install()
    uvloop.run(build_app(args).run())


if __name__ == "__main__":
    main()
