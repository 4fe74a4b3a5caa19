"""`python -m tests.bench.peer_arq`: the arq peer (a Redis job queue, no JetStream).

Jobs are enqueued with `_job_id` (arq's dedupe of the enqueue, not of the side effect); the
job does the HTTP part and returns the run's terminal status, which arq stores as the job
result. `max_jobs=100` matches the other systems' in-flight bound. arq publishes no chunks:
its figures are for a job that does less than the others' Action.
"""

from __future__ import annotations

import os
from typing import Any

import uvloop
from arq import Worker
from arq.connections import RedisSettings

from tests.bench import counting
from tests.bench.http_job import follow_run, job_of, new_client, start_run

IN_FLIGHT = 100
QUEUE = "arq:queue"


async def _noop(event: dict[str, Any]) -> None:
    return None


async def run_action(ctx: dict[str, Any], payload: bytes) -> str:
    """The HTTP part of one Action; arq stores the returned status as the job result."""
    job = job_of(payload)
    run_id = await start_run(ctx["http"], job)
    return await follow_run(ctx["http"], run_id, _noop)


async def startup(ctx: dict[str, Any]) -> None:
    ctx["http"] = new_client(os.environ["BENCH_HERMES_URL"], os.environ["BENCH_HERMES_KEY"])
    print("arq ready", flush=True)


async def shutdown(ctx: dict[str, Any]) -> None:
    await ctx["http"].aclose()


def main() -> None:
    counting.install()
    uvloop.install()
    worker = Worker(
        functions=[run_action],
        redis_settings=RedisSettings.from_dsn(os.environ["BENCH_REDIS_URL"]),
        on_startup=startup,
        on_shutdown=shutdown,
        max_jobs=IN_FLIGHT,
        poll_delay=0.05,
        job_timeout=int(os.environ.get("BENCH_ARQ_JOB_TIMEOUT_S", "300")),
        handle_signals=True,
    )
    worker.run()


if __name__ == "__main__":
    main()
