"""The worker's own publish-with-acknowledgement path (`worker.bus.acked_publish`) against a real
nats-server: the same answers as nats-py's `publish_async` (PubAck, duplicate, no stream,
JetStream's errors), slots given back, and a chunk stream that uses it stores every chunk."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import DiscardPolicy, StreamConfig
from nats.js.errors import APIError, NoStreamResponseError, TooManyStalledMsgsError

from schemas.chunk import ChunkKind
from schemas.ids import new_action_id
from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.aip_wire import chunk_view
from worker.bus.acked_publish import AckedPublisher
from worker.bus.publisher import MSG_ID, BusPublisher
from worker.execution.chunk_stream import ChunkStream
from worker.execution.leases import HeldLease
from worker.store.keys import ActionKeys
from worker.store.lease_store import AcquireStatus, LeaseGrant
from worker.testing.services import ServiceHandle

ENDPOINT = "h1"


@pytest.fixture
async def nc(nats_server: ServiceHandle) -> AsyncIterator[Client]:
    client = await nats.connect(nats_server.url)
    yield client
    await client.drain()


async def _stream(nc: Client, name: str, **config: object) -> str:
    js = nc.jetstream()
    subject = f"acked.{name}.{new_action_id()}"
    await js.add_stream(StreamConfig(name=f"ACKED_{name.upper()}", subjects=[subject], **config))
    return subject


async def test_acknowledgements_reach_their_publish_and_duplicates_are_named(nc: Client) -> None:
    subject = await _stream(nc, "plain")
    acks = AckedPublisher(nc)
    futures = [
        await acks.publish(subject, b"%d" % n, {MSG_ID: f"m{n}"}, 1.0) for n in range(50)
    ]
    replies = await asyncio.gather(*futures)
    assert [r.seq for r in replies] == list(range(1, 51))
    again = await (await acks.publish(subject, b"0", {MSG_ID: "m0"}, 1.0))
    assert again.duplicate is True
    assert again.seq == 1
    assert acks.pending == 0


async def test_no_stream_and_a_full_stream_raise_nats_pys_errors(nc: Client) -> None:
    acks = AckedPublisher(nc)
    with pytest.raises(NoStreamResponseError):
        await (await acks.publish(f"nobody.{new_action_id()}", b"x", {}, 1.0))
    subject = await _stream(nc, "full", max_msgs=1, discard=DiscardPolicy.NEW)
    await (await acks.publish(subject, b"1", {MSG_ID: "a"}, 1.0))
    with pytest.raises(APIError) as full:
        await (await acks.publish(subject, b"2", {MSG_ID: "b"}, 1.0))
    assert full.value.err_code == 10077  # BusPublisher's StreamFull test reads this code
    assert acks.pending == 0


@pytest.mark.aip_family("streaming_backpressure", assertions=["bounded_backpressure"])
async def test_a_cancelled_wait_gives_its_slot_back_and_a_full_set_stalls(nc: Client) -> None:
    # A plain subscriber is a responder that never answers: the acknowledgement never comes.
    silent = f"silent.{new_action_id()}"
    listener = await nc.subscribe(silent)
    acks = AckedPublisher(nc, max_pending=1)
    first = await acks.publish(silent, b"x", {}, 0.1)
    with pytest.raises(TooManyStalledMsgsError):
        await acks.publish(silent, b"y", {}, 0.1)
    first.cancel()
    await asyncio.sleep(0)
    assert acks.pending == 0
    second = await acks.publish(silent, b"z", {}, 0.1)  # the slot is free again
    second.cancel()
    await listener.unsubscribe()


async def test_a_freed_slot_goes_to_the_oldest_stalled_publish(nc: Client) -> None:
    silent = f"silent.{new_action_id()}"
    listener = await nc.subscribe(silent)
    acks = AckedPublisher(nc, max_pending=1)
    first = await acks.publish(silent, b"x", {}, 0.1)
    loop = asyncio.get_running_loop()
    older = loop.create_task(acks.publish(silent, b"y", {}, 5.0))
    await asyncio.sleep(0.01)
    newer = loop.create_task(acks.publish(silent, b"z", {}, 5.0))
    await asyncio.sleep(0.01)
    assert not older.done()
    assert not newer.done()
    first.cancel()  # its slot passes to the older stalled publish, not to a new count
    second = await asyncio.wait_for(older, 1.0)
    await asyncio.sleep(0.01)
    assert not newer.done()
    assert acks.pending == 1
    second.cancel()
    third = await asyncio.wait_for(newer, 1.0)
    assert acks.pending == 1
    third.cancel()
    assert acks.pending == 0
    (await acks.publish(silent, b"w", {}, 0.1)).cancel()  # one slot, free again
    await listener.unsubscribe()


async def test_a_chunk_stream_on_it_stores_every_chunk_in_order(nats_server: ServiceHandle) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        await provision(nc.jetstream(), Subjects(), [ENDPOINT], StreamPolicy(ack_wait_s=5.0))
        publisher = BusPublisher(nc.jetstream(), Subjects(), acks=AckedPublisher(nc))
        action_id = new_action_id()
        grant = LeaseGrant(
            status=AcquireStatus.ACQUIRED, fence=1, other_owner="", expires_at_ms=0,
            attempted_fence=0, cancel_requested=False,
        )
        lease = HeldLease(ActionKeys.of(action_id), "owner-1", grant, ttl_ms=30_000)
        stream = ChunkStream(publisher, lease, action_id=action_id, endpoint_id=ENDPOINT)
        for n in range(300):
            await stream.emit(ChunkKind.DATA, {"n": n})
        await stream.confirm()
        sub = await nc.jetstream().subscribe(
            Subjects().chunks(ENDPOINT, action_id), ordered_consumer=True
        )
        seqs = []
        try:
            while True:
                seqs.append(chunk_view((await sub.next_msg(timeout=0.5)).data)["seq"])
        except nats.errors.TimeoutError:
            pass
        assert seqs == list(range(300))
    finally:
        await nc.drain()


async def test_an_awaited_publish_answers_as_js_publish_and_times_out_as_it(nc: Client) -> None:
    subject = await _stream(nc, "awaited")
    acks = AckedPublisher(nc)
    first = await acks.publish_awaited(subject, b"1", {MSG_ID: "r1"}, 1.0)
    again = await acks.publish_awaited(subject, b"1", {MSG_ID: "r1"}, 1.0)
    assert (first.seq, first.duplicate, again.seq, again.duplicate) == (1, None, 1, True)
    with pytest.raises(NoStreamResponseError):
        await acks.publish_awaited(f"nobody.{new_action_id()}", b"x", {}, 1.0)
    silent = f"silent.{new_action_id()}"
    listener = await nc.subscribe(silent)
    with pytest.raises(nats.errors.TimeoutError):
        await acks.publish_awaited(silent, b"x", {}, 0.1)
    await listener.unsubscribe()


async def test_an_awaited_publish_takes_no_slot_of_the_unconfirmed_ones(nc: Client) -> None:
    subject = await _stream(nc, "unslotted")
    silent = f"silent.{new_action_id()}"
    listener = await nc.subscribe(silent)
    acks = AckedPublisher(nc, max_pending=1)
    held = await acks.publish(silent, b"x", {}, 0.1)  # the one slot, never answered
    with pytest.raises(TooManyStalledMsgsError):
        await acks.publish(silent, b"y", {}, 0.1)
    ack = await acks.publish_awaited(subject, b"r", {MSG_ID: "r"}, 1.0)
    assert (ack.seq, acks.pending) == (1, 1)
    held.cancel()
    await listener.unsubscribe()


async def test_a_confirmed_ack_removes_the_message_and_a_second_is_refused(
    nats_server: ServiceHandle,
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        subject = await _stream(nc, "acking")
        await js.publish(subject, b"work")
        sub = await js.pull_subscribe(subject, durable="acking")
        (msg,) = await sub.fetch(1, timeout=2.0)
        acks = AckedPublisher(nc)
        await acks.ack_confirmed(msg, 2.0)
        with pytest.raises(nats.errors.MsgAlreadyAckdError):
            await acks.ack_confirmed(msg, 2.0)
        info = await sub.consumer_info()
        assert (info.num_ack_pending, info.num_pending, info.num_redelivered) == (0, 0, 0)
        assert info.ack_floor.stream_seq == 1  # the server processed the ack it answered
        silent = f"silent.{new_action_id()}"
        listener = await nc.subscribe(silent)
        pretend = nats.aio.msg.Msg(nc, subject="x", reply=silent)
        with pytest.raises(nats.errors.TimeoutError):  # a reply subject nobody answers
            await acks.ack_confirmed(pretend, 0.1)
        await listener.unsubscribe()
    finally:
        await nc.drain()
