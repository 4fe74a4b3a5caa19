"""`python -m tests.bench.pacer`: a minimal Hermes `/v1/runs` whose streams keep a set pace.

The fake Hermes streams as fast as it can (or with fixed per-frame delays); two figures need
a *paced* source instead: the relay latency at 5,000 events/s offered, and 10,000 slow runs
that stay open long enough to be held at once. Only the routes the operator uses on that
path exist: `POST /v1/runs` (202 + run id), `GET /v1/runs/{id}/events` (SSE, `data:` only,
single use) and `GET /v1/runs/{id}` (status). Every event carries the wall-clock time it
was written (`timestamp`, seconds), which the chunk keeps in its payload, so a consumer on
the same host can tell how long the event took to reach it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import secrets
import sys
import time

import uvloop
from aiohttp import web

FLUSH_EVERY_S = 0.002
#: Pending connections the listening socket queues (the kernel caps it at somaxconn).
BACKLOG = 4096


class Pacer:
    def __init__(self, rate: float, count: int) -> None:
        self.rate = rate
        self.count = count
        self.runs: dict[str, str] = {}
        self.started = 0

    async def create(self, request: web.Request) -> web.Response:
        await request.read()
        run_id = "run_" + secrets.token_hex(16)
        self.runs[run_id] = "running"
        self.started += 1
        return web.json_response({"run_id": run_id, "status": "started"}, status=202)

    async def status(self, request: web.Request) -> web.Response:
        run_id = request.match_info["run_id"]
        if run_id not in self.runs:
            return web.json_response({"error": {"code": "run_not_found"}}, status=404)
        return web.json_response({"run_id": run_id, "status": self.runs[run_id]})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"started": self.started})

    async def events(self, request: web.Request) -> web.StreamResponse:
        run_id = request.match_info["run_id"]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        begin = loop.time()
        sent = 0
        # Write what the schedule says is due, in small batches: one write per event would
        # make the pacer itself the bottleneck at thousands of events per second.
        while sent < self.count:
            due = min(self.count, int((loop.time() - begin) * self.rate) + 1)
            if due > sent:
                frames = []
                now = time.time()
                for _ in range(due - sent):
                    event = {"event": "message.delta", "run_id": run_id, "timestamp": now,
                             "delta": "."}
                    frames.append(b"data: " + json.dumps(event).encode() + b"\n\n")
                await response.write(b"".join(frames))
                sent = due
            next_at = begin + sent / self.rate
            await asyncio.sleep(max(FLUSH_EVERY_S, next_at - loop.time()))
        self.runs[run_id] = "completed"
        done = {"event": "run.completed", "run_id": run_id, "timestamp": time.time(),
                "output": "done", "usage": {"input_tokens": 1, "output_tokens": 1,
                                            "total_tokens": 2}}
        await response.write(b"data: " + json.dumps(done).encode() + b"\n\n")
        await response.write(b": stream closed\n\n")
        await response.write_eof()
        return response


async def serve(args: argparse.Namespace) -> None:
    pacer = Pacer(args.rate, args.count)
    app = web.Application()
    app.router.add_post("/v1/runs", pacer.create)
    app.router.add_get("/v1/runs/{run_id}", pacer.status)
    app.router.add_get("/v1/runs/{run_id}/events", pacer.events)
    app.router.add_get("/_pacer/stats", pacer.stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # A deep accept queue: 10,000 runs open 10,000 connections within seconds, and past a
    # full queue (aiohttp's default is 128) the kernel drops the handshake and the client
    # retries it a second or more later, which would be charged to the worker's ramp.
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=BACKLOG)
    await site.start()
    port = runner.addresses[0][1]
    # The source of figure 3's latency for both relays: a full GC here would hold back
    # writes (their timestamps are taken when written, but the schedule slips).
    gc.collect()
    gc.freeze()
    sys.stdout.write(f"listening on http://127.0.0.1:{port}\n")
    sys.stdout.flush()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.pacer")
    parser.add_argument("--rate", type=float, required=True, help="events per second per run")
    parser.add_argument("--count", type=int, required=True, help="events per run")
    uvloop.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
