"""`python -m tests.bench.raw_loop`: the limit of this machine with full guarantees, no framework.

nats-py `fetch(≤128)` with 100 Actions in flight; per Action four EVALSHA compare-and-set
calls on hash-tagged keys (lease with a fence, start claim, run binding, fenced write-once
settle), the HTTP part of `tests.bench.http_job`, one `publish_async` per chunk and one for
the result (each with a `Nats-Msg-Id`), their confirmations, then `ack`. No heartbeat, no
trust checks, no audit: what is left is the cost of the guarantees themselves.

Like arq and FastStream it does not dedupe the provider side effect: after a kill -9 the
next owner's claim succeeds under its higher fence and the run is started again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aredis
import uvloop

from tests.bench import counting
from tests.bench.http_job import (
    ChunkChain,
    Job,
    follow_run,
    new_client,
    result_bytes,
    start_run,
    verified_job,
)

IN_FLIGHT = 100
FETCH = 128

#: Take the lease (fence = HINCRBY, never reset) unless another live owner holds it.
LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner = redis.call('HGET', KEYS[1], 'owner')
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires') or '0')
if owner and owner ~= '' and owner ~= ARGV[1] and expires > now then
  return {0, 0}
end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'expires', now + tonumber(ARGV[2]))
return {1, fence}
"""
#: Claim the start under the caller's fence; a settled Action is never claimed again.
CLAIM = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then
  return 'fenced_out'
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 'settled'
end
redis.call('HSET', KEYS[2], 'state', 'starting', 'fence', ARGV[2])
return 'claimed'
"""
#: Record the provider run id under the caller's fence.
BIND = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[2], 'state', 'bound', 'run_id', ARGV[3])
return 1
"""
#: Write the result and the terminal chunk once under the caller's fence and release the
#: lease in the same step (the worker stores the terminal chunk beside the result too).
SETTLE = """
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 'exists'
end
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then
  return 'fenced_out'
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[4])
redis.call('HSET', KEYS[1], 'owner', '', 'expires', 0)
return 'settled'
"""


class RawLoop:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.worker_id = args.worker_id
        self.in_flight = 0
        self.changed = asyncio.Event()
        self.stopping = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        args = self.args
        self.nc = await nats.connect(args.nats_url)
        self.js = self.nc.jetstream(publish_async_max_pending=256)
        self.redis: Any = aredis.from_url(args.redis_url)
        self.scripts = {
            name: self.redis.register_script(source)
            for name, source in (
                ("lease", LEASE),
                ("claim", CLAIM),
                ("bind", BIND),
                ("settle", SETTLE),
            )
        }
        self.http = new_client(args.hermes_url, Path(args.api_key_file).read_text().strip())
        sub = await self.js.pull_subscribe_bind(args.durable, stream=args.stream)
        print("raw loop ready", flush=True)
        while not self.stopping.is_set():
            free = IN_FLIGHT - self.in_flight
            if free <= 0:
                self.changed.clear()
                await self.changed.wait()
                continue
            try:
                msgs = await sub.fetch(min(FETCH, free), timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            self.in_flight += len(msgs)
            for msg in msgs:
                task = asyncio.get_running_loop().create_task(self.one(msg))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        await self.http.aclose()
        await self.nc.close()
        await self.redis.aclose()

    async def one(self, msg: Any) -> None:
        try:
            await self.handle(msg)
        except Exception as exc:
            print(f"action failed: {type(exc).__name__}: {exc}", flush=True)
            await msg.nak(delay=1.0)
        finally:
            self.in_flight -= 1
            self.changed.set()

    async def handle(self, msg: Any) -> None:
        job: Job = verified_job(msg.data)
        owner = f"{self.worker_id}#{secrets.token_hex(6)}"
        tag = "{" + job.id + "}"
        lease, binding, result = f"bench:{tag}:lease", f"bench:{tag}:binding", f"bench:{tag}:result"
        acquired, fence = await self.scripts["lease"](
            keys=[lease], args=[owner, self.args.lease_ttl_ms]
        )
        if not acquired:
            await msg.nak(delay=1.0)
            return
        claim = await self.scripts["claim"](keys=[lease, binding, result], args=[owner, fence])
        if claim != b"claimed":
            await msg.ack()
            return
        run_id = await start_run(self.http, job)
        await self.scripts["bind"](keys=[lease, binding], args=[owner, fence, run_id])
        chunks = f"aip.hermes.h1.chunks.{job.id}"
        futures: list[asyncio.Future[Any]] = []
        chain = ChunkChain(job.id, run_id)

        async def on_event(event: dict[str, Any]) -> None:
            kind = "done" if event.get("event") == "run.completed" else "data"
            seq = chain.sequence
            chunk = chain.next(kind, event)
            futures.append(
                await self.js.publish_async(
                    chunks, chunk, headers={"Nats-Msg-Id": f"{job.id}:{seq}"}
                )
            )

        terminal = await follow_run(self.http, run_id, on_event)
        status = "completed" if terminal == "run.completed" else "failed"
        last_chunk = chain.last
        body = result_bytes(job.id, status, self.worker_id, int(fence), last_chunk)
        settled = await self.scripts["settle"](
            keys=[lease, result, result + ":terminal"],
            args=[owner, fence, body, 86_400_000, last_chunk],
        )
        if settled == b"fenced_out":
            return
        futures.append(
            await self.js.publish_async(
                f"aip.hermes.h1.results.{job.id}",
                body,
                headers={"Nats-Msg-Id": f"{job.id}:result"},
            )
        )
        await asyncio.gather(*futures)
        await msg.ack()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.raw_loop")
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--hermes-url", required=True)
    parser.add_argument("--api-key-file", required=True)
    parser.add_argument("--stream", default="BENCH_JOBS")
    parser.add_argument("--durable", default="bench_raw")
    parser.add_argument("--lease-ttl-ms", type=int, default=15_000)
    parser.add_argument("--worker-id", default=f"raw-{os.getpid()}")
    args = parser.parse_args()
    counting.install()

    async def serve() -> None:
        loop = RawLoop(args)
        running = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            running.add_signal_handler(sig, loop.stopping.set)
        await loop.run()

    # `AIPD_BENCH_PROFILE=out.prof` (read by tests.bench.our_worker too) profiles this loop
    # into `out.prof.raw`, so one run gives both sides of the CPU-per-Action comparison.
    profile_to = os.environ.get("AIPD_BENCH_PROFILE")
    if not profile_to:
        uvloop.run(serve())
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.runcall(uvloop.run, serve())
    profiler.dump_stats(f"{profile_to}.raw")


if __name__ == "__main__":
    main()
