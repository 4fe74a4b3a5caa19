"""`python -m tests.bench.raw_relay`: the raw baselines of the chunk relay figure.

``publish``: nats-py `publish_async` (256 in flight, with `Nats-Msg-Id`) of one chunk payload
N times: the ceiling of getting chunks of that size onto JetStream from one process.
``relay``: the same publisher fed by one run's SSE stream (httpx-sse over the aiohttp
transport): what a relay without leases, bindings or trust does with the same events.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import msgspec
import nats
import uvloop

from tests.bench.http_job import ChunkChain, Job, follow_run, new_client, start_run

_encode = msgspec.json.Encoder()


async def publish(args: argparse.Namespace) -> None:
    nc = await nats.connect(args.nats_url)
    js = nc.jetstream(publish_async_max_pending=256)
    payload = Path(args.payload_file).read_bytes()
    subject = f"aip.hermes.h1.chunks.{args.action_id}"
    print("raw publish ready", flush=True)
    for seq in range(args.count):
        await js.publish_async(subject, payload, headers={"Nats-Msg-Id": f"{args.action_id}:{seq}"})
    await js.publish_async_completed()
    print("raw publish done", flush=True)
    await nc.close()


async def relay(args: argparse.Namespace) -> None:
    nc = await nats.connect(args.nats_url)
    js = nc.jetstream(publish_async_max_pending=256)
    key = Path(args.api_key_file).read_text().strip() if args.api_key_file else "unused"
    http = new_client(args.hermes_url, key)
    job = Job(id=args.action_id, input={"objective": "relay"})
    subject = f"aip.hermes.h1.chunks.{args.action_id}"
    chain: ChunkChain | None = None

    async def on_event(event: dict[str, Any]) -> None:
        assert chain is not None
        seq = chain.sequence
        await js.publish_async(
            subject,
            chain.next("data", event, whole=True),
            headers={"Nats-Msg-Id": f"{args.action_id}:{seq}"},
        )

    print("raw relay ready", flush=True)
    run_id = await start_run(http, job)
    chain = ChunkChain(args.action_id, run_id)
    await follow_run(http, run_id, on_event)
    await js.publish_async_completed()
    print("raw relay done", flush=True)
    await http.aclose()
    await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.raw_relay")
    parser.add_argument("mode", choices=("publish", "relay"))
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--action-id", required=True)
    parser.add_argument("--payload-file")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--hermes-url")
    parser.add_argument("--api-key-file")
    args = parser.parse_args()
    uvloop.run(publish(args) if args.mode == "publish" else relay(args))


if __name__ == "__main__":
    main()
