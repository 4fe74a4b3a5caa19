"""The gateway under load, in process on a real NATS server (issue 27, items 1 and 6).

Each test re-runs one measurement of the attack pass against the gateway's own parts
(`Children`, `GatewayService`, `Recovery`, `AipClient`), with a sandbox route whose
executor is the test itself: it publishes the children's results when it chooses, so the
followers really wait. Every test has its own subject prefix (its own streams).

- 2,000 concurrent follows: every one gets its result, no consumer is created on the
  results stream, one wake-up subscription serves them all (the measurement: 13,657
  "cannot follow" errors at the server's 1,000-consumer ceiling);
- the per-principal cap refuses the next sync call with `connector_host.capacity`
  before anything is enqueued, and leaves other principals alone;
- the recovery sweep finds a new orphan behind more settled history than the old sweep
  read in a pass, and an idle sweep costs the same whatever the history;
- `aip_action_events` skips a non-JSON message and passes no forged chunk.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from msgspec.structs import replace
from nats.aio.client import Client as NATS
from nats.js.api import StreamConfig

from schemas.chunk import DataChunk, DoneChunk
from schemas.delegation import ChildAction
from schemas.errors import ErrorCode
from schemas.lifecycle import LifecycleState, QueueRecord
from schemas.result import ActionResult, ResultStatus
from subjects.grammar import Subjects
from subjects.provision import provision
from worker.aip.signing import AipSigner
from worker.bus.stream_reads import Wakeups, pattern_of
from worker.client import AipClient
from worker.errors import ConnectorError
from worker.gateway.children import Children, now_ms
from worker.gateway.discovery import Discovery
from worker.gateway.observe import GatewayMetrics
from worker.gateway.open_children import own_key
from worker.gateway.principals import Principal
from worker.gateway.records import RuntimeStoreReader, RuntimeStoreWriter
from worker.gateway.recovery import Recovery
from worker.gateway.routes import Route, RouteTable
from worker.gateway.service import GatewayService
from worker.gateway.settings import PROTECTED_SCOPES, GatewaySettings
from worker.testing.gateway import principal_entry, write_principals_file
from worker.testing.identities import write_trust_files
from worker.testing.services import ServiceHandle
from worker.trust.signing import read_seed_file
from worker.wire.actions import GATEWAY_SENDER
from worker.wire.chunks import encode_chunk
from worker.wire.results import encode_result
from worker.wire.runtime_records import encode_queue_record

CAPABILITY = "cap:support_sandbox:load.echo"


@dataclass
class Harness:
    nc: NATS
    subjects: Subjects
    sandbox: str
    settings: GatewaySettings
    writer: RuntimeStoreWriter
    reader: RuntimeStoreReader
    children: Children
    service: GatewayService
    recovery: Recovery
    route: Route

    def principal(self, principal_id: str = "hermes:h1") -> Principal:
        return Principal(
            principal_id=principal_id,
            principal_kind="agent",
            tenant_id=None,
            authentication_issuer="test",
            revision=1,
            scopes=frozenset(PROTECTED_SCOPES),
            expires_at_unix_ms=now_ms() + 3_600_000,
        )

    def child(self, principal: Principal | None = None, **fields: Any) -> ChildAction:
        arguments = {"capability_id": CAPABILITY, "input": {"n": secrets.token_hex(4)}, **fields}
        return self.service.decode_contract(principal or self.principal(), arguments)[0]

    def record(self, child: ChildAction, *, age_ms: int = 0) -> QueueRecord:
        principal = self.principal()
        at = now_ms() - age_ms
        return QueueRecord(
            action=child,
            owner_principal_id=principal.principal_id,
            authenticated=principal.authenticated(),
            actor_principal_id=principal.principal_id,
            tenant_partition=None,
            state=LifecycleState.QUEUED,
            enqueued_at_unix_ms=at,
            updated_at_unix_ms=at,
        )

    async def answer(self, child: ChildAction, **fields: Any) -> None:
        """Publish the child's result as its executor would (unsigned: development)."""
        result = ActionResult(
            action_id=child.id,
            capability=child.capability,
            endpoint_id="sandbox",
            status=ResultStatus.COMPLETED,
            output={"echo": child.input},
            settled_by="load-test",
            fence=0,
            settled_at_unix_ms=now_ms(),
            # What the gateway dispatched: the child's Action Envelope, signed by its key.
            action_sha256=Children.envelope_sha256(
                child, self.route, AipSigner.from_nkey_seed(self.writer.seed)
            ),
            **fields,
        )
        await self.nc.jetstream().publish(
            self.route.subjects.results(child.id),
            encode_result(result, action=None, signer=None, endpoint_id="sandbox"),
        )

    async def results_consumers(self) -> int:
        info = await self.nc.jetstream().stream_info(self._sandbox_stream)
        return info.state.consumer_count

    @property
    def _sandbox_stream(self) -> str:
        return self.sandbox.upper().replace(".", "_")


@pytest.fixture
async def harness(tmp_path: Path, nats_server: ServiceHandle) -> AsyncIterator[Harness]:
    prefix = "ld" + secrets.token_hex(3)
    subjects = Subjects(prefix)
    sandbox = f"{prefix}.sandbox"
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await provision(js, subjects, ["h1"], runtime_stores=True)
    sandbox_stream = sandbox.upper().replace(".", "_")
    await js.add_stream(StreamConfig(name=sandbox_stream, subjects=[f"{sandbox}.>"]))
    trust = write_trust_files(tmp_path)
    seed = read_seed_file(trust.seed_file)
    principals = write_principals_file(tmp_path, [principal_entry("tok-" + "a" * 32, "x")])
    settings = GatewaySettings(
        mcp_principals_file=principals,
        gateway_signing_key_file=trust.seed_file,
        subject_prefix=prefix,
        capability_routes=json.dumps({"cap:support_sandbox:": sandbox}),
        allow_unsigned_responses=True,
        gateway_redispatch_after_ms=100,
        gateway_max_follows_per_principal=3,
    )
    writer = RuntimeStoreWriter(js, subjects, seed)
    reader = RuntimeStoreReader(js, subjects, own_key(seed))
    children = Children(nc, writer, seed)
    routes = RouteTable.from_setting(prefix, settings.capability_routes)
    route = routes.resolve(CAPABILITY)
    assert route is not None
    service = GatewayService(settings, nc, routes, reader, children, Discovery(nc))
    recovery = Recovery(settings, children, reader, routes, GatewayMetrics())
    try:
        yield Harness(
            nc, subjects, sandbox, settings, writer, reader, children, service, recovery, route
        )
    finally:
        await service.stop()
        for name in await js.streams_info():
            if name.config.name and name.config.name.startswith(prefix.upper()):
                await js.delete_stream(name.config.name)
        await nc.close()


# --- item 1: one shared subscription, no consumer, for any number of follows --------------


async def test_two_thousand_concurrent_follows_all_get_their_result_without_a_consumer(
    harness: Harness,
) -> None:
    h = harness
    kids = [h.child() for _ in range(2_000)]
    started = time.monotonic()
    follows = [asyncio.create_task(h.children.wait_result(h.route, kid, 180.0)) for kid in kids]
    wakeups = Wakeups.of(h.nc)
    pattern = pattern_of(h.route.subjects.results(kids[0].id))
    # Each follower first reads its subject once (a message get): 2,000 reads took over 60 s
    # on a loaded 2-core CI host. What this test holds is "no consumer", not a speed.
    deadline = time.monotonic() + 120
    while wakeups._count.get(pattern, 0) < len(kids):  # every follower is waiting
        assert time.monotonic() < deadline, "the followers did not all start"
        await asyncio.sleep(0.05)
    # The measurement's failure: one ordered consumer per followed child.
    assert await h.results_consumers() == 0
    assert list(wakeups._subs) == [pattern]
    await asyncio.gather(*(h.answer(kid) for kid in kids))
    outcomes = await asyncio.gather(*follows, return_exceptions=True)
    elapsed = time.monotonic() - started
    errors = [o for o in outcomes if not isinstance(o, ActionResult)]
    assert errors == []
    assert [o.action_id for o in outcomes if isinstance(o, ActionResult)] == [k.id for k in kids]
    assert await h.results_consumers() == 0
    print(f"2000 concurrent follows: 0 errors, 0 consumers, {elapsed:.1f} s")


async def test_publishers_follow_their_results_without_a_consumer_either(
    harness: Harness,
) -> None:
    """`AipClient.result()` uses the same follower: 500 waiting publishers, no consumer."""
    h = harness
    client = AipClient(h.nc, prefix=h.subjects.prefix)
    ids = [h.child().id for _ in range(500)]
    waits = [
        asyncio.create_task(client.handle("h1", action_id).result(timeout_s=120.0))
        for action_id in ids
    ]
    await asyncio.sleep(1.0)
    results_stream = h.subjects.stream_name("results")
    js = h.nc.jetstream()
    assert (await js.stream_info(results_stream)).state.consumer_count == 0
    for action_id in ids:
        await js.publish(
            h.subjects.results("h1", action_id),
            encode_result(
                ActionResult(
                    action_id=action_id,
                    capability="cap:hermes_agent:h1:models",
                    endpoint_id="h1",
                    status=ResultStatus.COMPLETED,
                    settled_by="load-test",
                    fence=0,
                    settled_at_unix_ms=now_ms(),
                ),
                action=None,
                signer=None,
                endpoint_id="h1",
            ),
        )
    assert (await js.stream_info(results_stream)).state.consumer_count == 0
    outcomes = await asyncio.gather(*waits, return_exceptions=True)
    assert [o for o in outcomes if not isinstance(o, ActionResult)] == []


async def test_a_principal_past_its_follow_cap_is_refused_before_anything_is_enqueued(
    harness: Harness,
) -> None:
    h = harness  # the cap is 3 (AIPD_GATEWAY_MAX_FOLLOWS_PER_PRINCIPAL)
    busy = h.principal("hermes:busy")
    other = h.principal("hermes:other")
    arguments = {"capability_id": CAPABILITY, "input": {}, "mode": "sync", "timeout_ms": 60_000}
    held = [asyncio.create_task(h.service.call(busy, dict(arguments))) for _ in range(3)]
    while h.service.follows.held(busy) < 3:
        await asyncio.sleep(0.01)
    with pytest.raises(ConnectorError) as refused:
        await h.service.call(busy, {**arguments, "action_id": "act_" + "e" * 32})
    assert refused.value.code is ErrorCode.HOST_CAPACITY
    assert refused.value.to_protocol(endpoint_id=None, read_only=False).retryable
    # Refused before the queue entry: nothing under that id was enqueued.
    from worker.gateway.service import namespaced_action_id

    taken = namespaced_action_id(busy.principal_id, None, "act_" + "e" * 32)
    assert await h.reader.queue(taken) is None
    # Another principal is not held back by this one's calls.
    theirs = asyncio.create_task(h.service.call(other, dict(arguments)))
    while h.service.follows.held(other) < 1:
        assert not theirs.done(), theirs.result()
        await asyncio.sleep(0.01)
    # Answer every waiting child: the calls return, the cap is free again. The open index
    # is written in batches, so a child may be listed a moment after its follow began:
    # answer what is listed until every call has returned (bounded).
    calls = [*held, theirs]
    answered: set[str] = set()
    for _ in range(200):
        if all(call.done() for call in calls):
            break
        for record in await h.recovery.open_entries():
            if record.action.id not in answered:
                answered.add(record.action.id)
                await h.answer(record.action)
        await asyncio.sleep(0.05)
    views = await asyncio.gather(*calls)
    assert [v["state"] for v in views] == ["completed"] * 4
    assert h.service.follows.held(busy) == 0


# --- item 1: the recovery sweep reads open children only ---------------------------------


async def _settled_history(h: Harness, count: int) -> None:
    """`count` settled children on the queue stream: their terminal entries, signed as a
    gateway writes them (a settled child has left the open index already)."""

    async def one() -> None:
        record = replace(h.record(h.child()), state=LifecycleState.COMPLETED)
        await RuntimeStoreWriter._publish(
            h.writer,
            h.subjects.runtime_queue(record.action.id),
            encode_queue_record(
                record, signer=AipSigner.from_nkey_seed(h.writer.seed), sender=GATEWAY_SENDER
            ),
            msg_id=f"{record.action.id}:queue:completed",
        )

    for start in range(0, count, 200):
        await asyncio.gather(*(one() for _ in range(min(200, count - start))))


async def _idle_sweep_ms(h: Harness, sweeps: int = 50) -> tuple[float, float]:
    """CPU and wall time of one sweep with nothing to do (ms, mean of `sweeps`)."""
    cpu = time.process_time()
    wall = time.monotonic()
    for _ in range(sweeps):
        assert await h.recovery.sweep() == 0
    return (
        (time.process_time() - cpu) * 1000 / sweeps,
        (time.monotonic() - wall) * 1000 / sweeps,
    )


async def test_a_new_orphan_behind_a_long_history_is_recovered_in_the_next_sweep(
    harness: Harness,
) -> None:
    h = harness
    empty_cpu_ms, _ = await _idle_sweep_ms(h)
    # More settled history than the old sweep read in one pass (10,000 entries).
    history = 12_000
    await _settled_history(h, history)
    queue = h.subjects.runtime_stream_name("queue")
    assert (await h.nc.jetstream().stream_info(queue)).state.messages == history
    # An orphan: its gateway died right after creating the queue entry (never dispatched).
    orphan = h.record(h.child(), age_ms=5_000)
    await h.writer.create_queue_entry(orphan)
    assert (await h.recovery.open_entries()) == [orphan]
    assert await h.recovery.sweep() == 1  # dispatched again, the same id
    after = await h.reader.queue(orphan.action.id)
    assert after is not None
    assert after.state is LifecycleState.RUNNING
    dispatched = await h.nc.jetstream().get_last_msg(
        h.sandbox.upper().replace(".", "_"), h.route.subjects.actions
    )
    assert msgspec.json.decode(dispatched.data or b"")["body"]["action"]["id"] == orphan.action.id
    # Its result settles it in the next sweep, and it leaves the index.
    await h.answer(orphan.action)
    assert await h.recovery.sweep() == 1
    settled = await h.reader.queue(orphan.action.id)
    assert settled is not None
    assert settled.state is LifecycleState.COMPLETED
    assert await h.recovery.open_entries() == []

    # An idle sweep costs the same whatever lies behind it: a stream info and one get.
    cpu_ms, wall_ms = await _idle_sweep_ms(h)
    assert cpu_ms < 5.0, f"an idle sweep took {cpu_ms:.2f} ms of CPU"
    assert cpu_ms < 3 * empty_cpu_ms + 1.0, (empty_cpu_ms, cpu_ms)
    print(
        f"idle sweep: {empty_cpu_ms:.2f} ms CPU with no history, {cpu_ms:.2f} ms CPU "
        f"({wall_ms:.2f} ms wall) behind {history} settled children"
    )


async def test_the_sweep_cleans_what_a_dead_gateway_left_in_the_index(harness: Harness) -> None:
    """A child terminal but still in the index (its gateway died between the two writes),
    and an id added whose queue entry never came: both leave the index."""
    h = harness
    done = h.record(h.child())
    await h.writer.create_queue_entry(done)
    # The terminal entry written by hand, without the index update that follows it.
    terminal = replace(done, state=LifecycleState.FAILED)
    await RuntimeStoreWriter._publish(
        h.writer,
        h.subjects.runtime_queue(done.action.id),
        encode_queue_record(
            terminal, signer=AipSigner.from_nkey_seed(h.writer.seed), sender=GATEWAY_SENDER
        ),
        msg_id=f"{done.action.id}:queue:failed",
    )
    never = h.child()
    await h.writer.open_children.add(never.id)
    await asyncio.sleep(0.2)  # older than gateway_redispatch_after_ms
    assert await h.recovery.open_entries() == []
    assert await h.writer.open_children.snapshot() == {}


# --- item 6: aip_action_events ------------------------------------------------------------


def _chunks(child: ChildAction, texts: list[str]) -> list[bytes]:
    """A chain of data chunks and a done chunk, each naming the hash of the one before."""
    out: list[bytes] = []
    prev: str | None = None
    for seq, text in enumerate([*texts, None]):
        fields: dict[str, Any] = dict(
            action_id=child.id, endpoint_id="sandbox", seq=seq, prev_sha256=prev,
            ts_unix_ms=now_ms(),
        )  # fmt: skip
        chunk = DataChunk(payload={"text": text}, **fields) if text else DoneChunk(**fields)
        data = encode_chunk(chunk)
        out.append(data)
        prev = hashlib.sha256(data).hexdigest()
    return out


async def test_events_skip_a_non_json_message_and_pass_no_forged_chunk(
    harness: Harness,
) -> None:
    h = harness
    principal = h.principal()
    child = h.child(principal, mode="async", timeout_ms=60_000)
    record = h.record(child)
    await h.writer.create_queue_entry(record)
    js = h.nc.jetstream()
    subject = h.route.subjects.chunks(child.id)
    real = _chunks(child, ["one", "two"])
    await js.publish(subject, real[0])
    await js.publish(subject, b"\xff not json at all")
    # A forged chunk 1 that links to the real chunk 0, published before the real one.
    forged = _chunks(child, ["one", "forged"])[1]
    await js.publish(subject, forged)
    await js.publish(subject, b'{"kind": "data", "seq": "x"}')
    for data in real[1:]:
        await js.publish(subject, data)
    # The executor's signed result names the real chain's last chunk.
    await h.answer(child, last_chunk_sha256=hashlib.sha256(real[-1]).hexdigest())

    answer, _ = await h.service.events(principal, child.id)
    chain = [hashlib.sha256(data).hexdigest() for data in real]
    assert [e["data"]["sha256"] for e in answer["events"]] == chain
    assert [e["kind"] for e in answer["events"]] == [
        "stream_chunk.data",
        "stream_chunk.data",
        "stream_chunk.done",
    ]
    assert all(e["data"]["verified"] is True for e in answer["events"])
    assert answer["terminal"] is True
    assert "cursor" not in answer  # the ended Action's last page
    # Paging goes on from the cursor along the same chain.
    page, _ = await h.service.events(principal, child.id, cursor=1, limit=1, include_chunks=True)
    assert [e["data"]["sequence"] for e in page["events"]] == [1]
    assert [e["data"]["sha256"] for e in page["events"]] == chain[1:2]
    assert "two" in json.dumps(page["chunks"])


async def test_events_before_the_result_follow_the_chain_forward_unverified(
    harness: Harness,
) -> None:
    h = harness
    principal = h.principal()
    child = h.child(principal, mode="async", timeout_ms=60_000)
    await h.writer.create_queue_entry(h.record(child))
    js = h.nc.jetstream()
    subject = h.route.subjects.chunks(child.id)
    real = _chunks(child, ["one", "two"])
    await js.publish(subject, real[0])
    await js.publish(subject, b"not json")
    # A chunk that does not name its predecessor's hash is not passed.
    unlinked = encode_chunk(
        DataChunk(
            action_id=child.id, endpoint_id="sandbox", seq=1, prev_sha256="0" * 64,
            payload={"text": "unlinked"}, ts_unix_ms=now_ms(),
        )
    )  # fmt: skip
    await js.publish(subject, unlinked)
    await js.publish(subject, real[1])
    answer, _ = await h.service.events(principal, child.id)
    chain = [hashlib.sha256(data).hexdigest() for data in real[:2]]
    assert [e["data"]["sha256"] for e in answer["events"]] == chain
    assert all(e["data"]["verified"] is False for e in answer["events"])
    assert answer["terminal"] is False
    # Its terminal chunk alone does not end it (anyone may publish one, and a child of a
    # non-streaming capability has none): only its result does, and there is none yet.
    await js.publish(subject, real[2])
    answer, _ = await h.service.events(principal, child.id)
    assert [e["kind"] for e in answer["events"]][-1] == "stream_chunk.done"
    assert answer["terminal"] is False
    assert "cursor" in answer


async def test_a_contract_without_a_mode_gets_the_capabilitys_default(harness: Harness) -> None:
    """As AipClient.build_action: a streaming twin takes only `stream`, so a call naming no
    mode asks for it; anything else defaults to `async`; a named mode is kept."""
    twin = harness.child(capability_id="cap:hermes_agent:h1:chat_stream")
    assert twin.mode.value == "stream"
    assert harness.child(capability_id="cap:hermes_agent:h1:chat").mode.value == "async"
    named = harness.child(capability_id="cap:hermes_agent:h1:chat", mode="sync")
    assert named.mode.value == "sync"
