"""The Actions a benchmark offers, and how their completions are observed.

Every system gets the same envelope: an operator objective signed by the gateway key of
`write_trust_files`, from a principal of the identity directory. For our worker each Action is
approved up front by the authority file's approver (through `worker.trust.approval_ledger.approve`,
the path a real approver takes), before any counter is read, so approval writes are never
charged to the worker. Envelopes are built and signed before the clock starts, because the
publisher shares the two cores with the systems under test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

from schemas.action import Action, Identity
from schemas.approval import ApprovalDecision
from schemas.ids import new_action_id
from subjects.grammar import envelope_msg_id
from tests.bench.env import ENDPOINT, Bench
from worker.store.clock import redis_now_ms
from worker.testing.identities import (
    APPROVER_UNTENANTED,
    ISSUER,
    PRINCIPAL_KIND,
    REVISION,
    USER_UNTENANTED,
)
from worker.testing.scenario import SLOW_REPLY
from worker.trust.approval_ledger import approve
from worker.trust.authority import ApprovalAuthority
from worker.wire.actions import decode_action

#: The objective of a plain Action; the fake answers it with word-sized `message.delta`s.
OBJECTIVE = "bench run"
#: The objective of a slow Action: 40 deltas 100 ms apart (about 4 s of streaming).
SLOW_OBJECTIVE = f"bench {SLOW_REPLY}"
#: The peers' work-queue stream and subject (our worker reads `aip.hermes.h1.actions`).
PEER_STREAM = "BENCH_JOBS"
PEER_SUBJECT = "bench.jobs"


@dataclass(frozen=True, slots=True)
class Envelope:
    action_id: str
    payload: bytes
    headers: dict[str, str]


def build_envelopes(
    bench: Bench, count: int, objective: str = OBJECTIVE, endpoint: str = ENDPOINT
) -> list[Envelope]:
    """Signed operator Actions; the same bytes go to every system."""
    out = []
    now = time.time_ns() // 1_000_000
    for _ in range(count):
        action = Action(
            id=new_action_id(),
            capability=f"cap:hermes_agent:{endpoint}:operator",
            input={"objective": objective},
            identity=Identity(
                principal_id=USER_UNTENANTED,
                principal_kind=PRINCIPAL_KIND,
                authentication_issuer=ISSUER,
                credential_revision=REVISION,
            ),
            created_at_unix_ms=now,
        )
        action = _with_idempotency(action)
        payload = bench.trust.seal_action(action)
        headers = {"Nats-Msg-Id": envelope_msg_id(action.id, payload)}
        out.append(Envelope(action.id, payload, headers))
    return out


def _with_idempotency(action: Action) -> Action:
    # The operator requires an idempotency key; the Action id is the natural one.
    return msgspec.structs.replace(action, idempotency_key=action.id)


async def approve_all(bench: Bench, envelopes: Iterable[Envelope], concurrency: int = 64) -> None:
    """Record an approval for every Action, as the authority's approver would."""
    r = bench.redis()
    try:
        authority = ApprovalAuthority.load(
            bench.trust.authority_file, now_ms=await redis_now_ms(r)
        )
        gate = asyncio.Semaphore(concurrency)

        async def one(envelope: Envelope) -> None:
            action, _ = decode_action(envelope.payload)
            async with gate:
                await approve(
                    r, authority, action, APPROVER_UNTENANTED, "benchmark",
                    ApprovalDecision.APPROVED, ttl_ms=3_600_000,
                    seed=bench.trust.approver_seed(APPROVER_UNTENANTED),
                )

        await asyncio.gather(*(one(e) for e in envelopes))
    finally:
        await r.aclose()


async def publish_all(nc: NATS, subject: str, envelopes: list[Envelope]) -> None:
    """Publish every envelope with bounded in-flight publish_async, then await the acks."""
    js = nc.jetstream(publish_async_max_pending=1024)
    for envelope in envelopes:
        await js.publish_async(subject, envelope.payload, headers=envelope.headers)
    await js.publish_async_completed()


async def provision_peer_stream(bench: Bench, durable: str, *, ack_wait_s: float = 30.0) -> None:
    """The peers' work queue: file storage and one durable pull consumer, like ours."""
    nc = await nats.connect(bench.nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(
            name=PEER_STREAM, subjects=[PEER_SUBJECT], retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE, duplicate_window=120.0,
        ))
        await js.add_consumer(PEER_STREAM, ConsumerConfig(
            durable_name=durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait_s,
            max_ack_pending=100_000, max_deliver=-1,
        ))
    finally:
        await nc.close()


@dataclass
class Completions:
    """First-seen times of results (and of chunks, when asked) per Action id, on core NATS."""

    results: dict[str, float] = field(default_factory=dict)
    chunks: dict[str, list[tuple[float, bytes]]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def subscribe(self, nc: NATS, *, chunks: bool = False) -> None:
        async def on_result(msg: Any) -> None:
            action_id = msg.subject.rsplit(".", 1)[1]
            self.results.setdefault(action_id, time.monotonic())
            self.changed.set()

        async def on_chunk(msg: Any) -> None:
            action_id = msg.subject.rsplit(".", 1)[1]
            self.chunks.setdefault(action_id, []).append((time.monotonic(), msg.data))
            self.changed.set()

        await nc.subscribe(f"aip.hermes.{ENDPOINT}.results.*", cb=on_result)
        if chunks:
            await nc.subscribe(f"aip.hermes.{ENDPOINT}.chunks.*", cb=on_chunk)
        await nc.flush()

    async def wait_results(self, ids: set[str], timeout_s: float) -> float:
        """Wait until every id has a result; returns the time the last one arrived."""
        deadline = time.monotonic() + timeout_s
        while not ids.issubset(self.results):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = len(ids - self.results.keys())
                raise TimeoutError(f"{missing} of {len(ids)} Actions have no result")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), min(remaining, 1.0))
            except TimeoutError:
                continue
        return max(self.results[i] for i in ids)
