"""`python -m tests.bench.held_stream`: the bytes one held Hermes event stream keeps.

Figure 4 (10,000 held runs in one worker) is mostly what each run's open event stream
keeps; this measures that part alone and quickly, in one process: `--streams` event streams
are opened through `HermesClient.stream_sse` against the scripted server of the client
tests (tests/hermes/scripted_server.py), each reads one event and waits for the next, which
never comes; tracemalloc compares the heap before and after, per stream. The server's side
of each connection is in the same process and counted too, so compare runs with each other
(one transport against the other, a change against its parent), not with figure 4's KiB/run.

    .venv/bin/python -m tests.bench.held_stream                  # aiohttp transport
    .venv/bin/python -m tests.bench.held_stream --transport httpx --top 20
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tracemalloc

from tests.hermes.scripted_server import SSE_HEADERS, Reply, ScriptedServer, make_client, sse
from worker.hermes.http_client import HermesClient, Transport

ROUTE = "/v1/runs/{run_id}/events"
#: One event of about the size of a Hermes `message.delta`.
EVENT = 'data: {"event": "message.delta", "delta": "' + "x" * 200 + '"}\n\n'


async def _hold(client: HermesClient, ready: asyncio.Future[None]) -> None:
    async with client.stream_sse("GET", ROUTE, {"run_id": "r"}) as stream:
        events = stream.events()
        try:
            await anext(events)
            ready.set_result(None)
            await anext(events)  # held here until cancelled
        finally:
            await events.aclose()


async def measure(transport: Transport, streams: int, top: int) -> float:
    """Bytes per held stream (and the `top` allocation sites, printed)."""
    server = ScriptedServer()
    await server.start()
    server.script(
        "/v1/runs/r/events", Reply(headers=SSE_HEADERS, body=[sse(EVENT)], linger_s=600)
    )
    client = make_client(server.url, transport)
    held: list[asyncio.Task[None]] = []
    try:
        warm: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        held.append(asyncio.create_task(_hold(client, warm)))  # pools and imports made
        await warm
        gc.collect()
        tracemalloc.start(10)
        before = tracemalloc.take_snapshot()
        for _ in range(streams):
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            held.append(asyncio.create_task(_hold(client, ready)))
            await ready
        await asyncio.sleep(0.2)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        stats = after.compare_to(before, "lineno")
        per_stream = sum(stat.size_diff for stat in stats) / streams
        print(f"{transport}: {per_stream:,.0f} B per held stream ({streams} streams)")
        for stat in stats[:top]:
            print(f"  {stat.size_diff / streams:7,.0f} B  {stat.traceback}")
        return per_stream
    finally:
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        await client.aclose()
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.held_stream", description=__doc__)
    parser.add_argument("--transport", choices=("h1", "aiohttp", "httpx"), default="h1")
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--top", type=int, default=0, help="allocation sites to show")
    args = parser.parse_args()
    asyncio.run(measure(args.transport, args.streams, args.top))


if __name__ == "__main__":
    main()
