"""The bus's own storage is bounded (issue 19): every stream has a byte limit `provision`
sets, a refused payload costs the DLQ a few KiB whatever its size, and a flood of junk on an
actions subject neither outgrows any stream nor stops legitimate work."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time

import nats
from nats.js.api import DiscardPolicy
from nats.js.errors import APIError
from prometheus_client.parser import text_string_to_metric_families

from schemas.result import ResultStatus
from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.integration.stack import ENDPOINT, Stack
from worker.bus.dead_letters import TokenBucket
from worker.testing.services import ServiceHandle, free_port

KIB = 1024
MIB = 1024 * KIB


async def test_a_large_junk_payload_is_kept_truncated_with_its_size_and_sha256(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    # The test server's max_payload is 1 MiB. The first byte is one no JSON value starts
    # with, so the junk is never read as the start of a document.
    junk = b"\xff" + os.urandom(900 * KIB - 1)
    await stack.publish_raw(junk)
    await stack.settled_and_acked()

    [(body, headers)] = await stack.dlq()
    assert body == junk[: 4 * KIB]
    assert headers["size"] == len(junk)
    assert headers["sha256"] == hashlib.sha256(junk).hexdigest()
    assert headers["code"] == "envelope.decode.invalid"
    info = await stack.nc.jetstream().stream_info(stack.subjects.stream_name("dlq"))
    # 4 KiB kept, as base64 (x 4/3) inside the signed Envelope with its facts.
    assert info.state.bytes < 7 * KIB


async def test_a_junk_flood_stays_within_every_byte_limit_and_a_legitimate_action_runs(
    stack: Stack,
) -> None:
    js = stack.nc.jetstream()
    subjects = stack.subjects
    # Small limits, so the flood reaches them in seconds.
    small = StreamPolicy(
        ack_wait_s=3.0, actions_max_bytes=4 * MIB, dlq_max_bytes=64 * KIB, dlq_max_msgs=1_000
    )
    await provision(js, subjects, [ENDPOINT], small)
    dlq_before = (await js.stream_info(subjects.stream_name("dlq"))).state.last_seq
    junk_size, junk_count = 256 * KIB, 400  # 100 MiB offered per round, 25x the queue
    refusals: list[int | None] = []  # err_code of every publish the queue refused
    peak = {"actions": 0, "dlq": 0}

    async def watch() -> None:
        while True:
            for kind in peak:
                state = (await js.stream_info(subjects.stream_name(kind))).state
                peak[kind] = max(peak[kind], state.bytes)
            await asyncio.sleep(0.05)

    async def flood(round_: int) -> None:
        for n in range(junk_count):
            try:
                await js.publish(
                    subjects.actions(ENDPOINT),
                    os.urandom(junk_size),
                    headers={"Nats-Msg-Id": f"junk-{round_}-{n}"},
                )
            except APIError as exc:
                refusals.append(exc.err_code)

    watcher = asyncio.create_task(watch())
    # Round 1, no worker yet: the queue fills to its limit and refuses the rest.
    await flood(1)
    refused = len(refusals)
    queued = (await js.stream_info(subjects.stream_name("actions"))).state
    assert queued.bytes <= 4 * MIB
    assert refused > 0
    refused_unconsumed = refused
    # Round 2, while a worker refuses junk as fast as it arrives.
    metrics_port = free_port()
    await stack.spawn(
        "w1",
        AIPD_METRICS_PORT=str(metrics_port),
        AIPD_DLQ_RATE_PER_S="5",
        AIPD_DLQ_BURST="10",
    )
    started = time.monotonic()
    await flood(2)
    flood_s = time.monotonic() - started
    refused = len(refusals)
    # Maximum bytes exceeded: the queue refused them at publish, it dropped none.
    assert set(refusals) == {10077}

    canary = stack.action("models")
    published = time.monotonic()
    handle = None
    while handle is None:  # the queue may still be full of junk the worker is refusing
        try:
            handle = await stack.publish(canary)
        except APIError as exc:
            if exc.err_code != 10077 or time.monotonic() - published > 30:
                raise
            await asyncio.sleep(0.1)
    result = await handle.result(timeout_s=30)
    canary_s = time.monotonic() - published
    await stack.settled_and_acked(timeout_s=60)
    watcher.cancel()

    assert result.status is ResultStatus.COMPLETED
    dlq = (await js.stream_info(subjects.stream_name("dlq"))).state
    assert peak["actions"] <= 4 * MIB
    assert peak["dlq"] <= 64 * KIB
    assert dlq.bytes <= 64 * KIB
    scrape = await _scrape(metrics_port)
    dropped = "aip_hermes_worker_dlq_dropped_total"
    over_rate = value(scrape, dropped, endpoint=ENDPOINT, reason="rate")
    full = value(scrape, dropped, endpoint=ENDPOINT, reason="full")
    # Mostly `envelope.decode.invalid`; random bytes that open like JSON are schema errors.
    written = sum(
        value(scrape, "aip_hermes_worker_dlq_entries_total", endpoint=ENDPOINT, code=code)
        for code in ("envelope.decode.invalid", "schema.envelope.invalid")
    )
    consumed = 2 * junk_count - refused
    # Every entry counted written was accepted by the DLQ. Near its byte limit nats-server
    # can accept an entry by its `discard: new` check and then drop the oldest one by its
    # own byte accounting (first_seq moves): so the entries accepted, not those left, are
    # what the count is held to.
    assert written == dlq.last_seq - dlq_before
    assert dlq.messages <= written
    assert written + over_rate + full == consumed
    assert over_rate > 0
    print(
        f"\nflood: 2 x {junk_count} x {junk_size // KIB} KiB offered; with no worker the "
        f"queue held {queued.messages} ({queued.bytes / MIB:.2f} MiB, limit 4) and refused "
        f"{refused_unconsumed}; with a worker, round 2 took {flood_s:.1f} s and "
        f"{refused - refused_unconsumed} were refused; {consumed} consumed in all; "
        f"peak actions stream {peak['actions'] / MIB:.2f} MiB (limit 4), "
        f"DLQ {dlq.messages} entries / {dlq.bytes / KIB:.1f} KiB (limit 64, peak "
        f"{peak['dlq'] / KIB:.1f}), not kept: {over_rate:.0f} over rate, {full:.0f} DLQ full; "
        f"canary completed {canary_s:.2f} s after its publish"
    )


def value(scrape: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


async def _scrape(port: int) -> str:
    import aiohttp

    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        return await response.text()


async def test_provision_sets_every_streams_limits_from_the_settings(
    nats_server: ServiceHandle,
) -> None:
    env = {
        **os.environ,
        "AIPD_NATS_URL": nats_server.url,
        "AIPD_HERMES_ENDPOINTS": f"{ENDPOINT}=http://127.0.0.1:1",
        "AIPD_STREAM_ACTIONS_MAX_BYTES": str(64 * MIB),
        "AIPD_STREAM_ACTIONS_MAX_MSGS": "5000",
        "AIPD_STREAM_DLQ_MAX_BYTES": str(8 * MIB),
        "AIPD_STREAM_DLQ_MAX_MSGS": "2000",
    }

    def run_provision() -> str:
        done = subprocess.run(
            # The harness's server may predate the release check (its own test:
            # tests/integration/test_provision_store.py).
            [sys.executable, "-m", "worker", "provision", "--allow-nats-below-minimum"],
            capture_output=True, text=True, timeout=60, env=env, check=True,
        )  # fmt: skip
        return done.stdout

    await asyncio.to_thread(run_provision)
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        subjects = Subjects()
        got = {
            kind: (await js.stream_info(subjects.stream_name(kind))).config
            for kind in ("actions", "delegations", "chunks", "results", "dlq", "audit")
        }
        defaults = StreamPolicy()
        assert (got["actions"].max_bytes, got["actions"].max_msgs) == (64 * MIB, 5000)
        assert got["actions"].discard == DiscardPolicy.NEW
        assert got["delegations"].max_bytes == defaults.delegations_max_bytes
        assert got["delegations"].discard == DiscardPolicy.NEW
        assert got["chunks"].max_bytes == defaults.chunks_max_bytes
        assert got["results"].max_bytes == defaults.results_max_bytes
        assert got["audit"].max_bytes == defaults.audit_max_bytes
        assert (got["dlq"].max_bytes, got["dlq"].max_msgs) == (8 * MIB, 2000)
        assert got["dlq"].discard == DiscardPolicy.NEW
        assert all(config.max_bytes and config.max_bytes > 0 for config in got.values())

        # A changed limit is applied in place to the existing stream, messages kept.
        await js.publish(subjects.dlq(ENDPOINT), b"evidence")
        env["AIPD_STREAM_DLQ_MAX_BYTES"] = str(16 * MIB)
        report = await asyncio.to_thread(run_provision)
        assert "changed max_bytes" in report
        info = await js.stream_info(subjects.stream_name("dlq"))
        assert info.config.max_bytes == 16 * MIB
        assert info.state.messages == 1
    finally:
        await nc.close()


def test_the_dlq_token_bucket_allows_the_burst_then_the_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate_per_s=2.0, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] += 1.0  # two tokens refilled
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    now[0] += 60.0  # never more than the burst saved up
    assert sum(bucket.take() for _ in range(10)) == 3
