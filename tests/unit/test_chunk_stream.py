"""The chunk stream decides every seq of an Action: start, the one terminal chunk, and the
lease check before each publish (worker/execution/chunk_stream.py); the takeover's
continuation is tests/integration/test_chunk_chain_takeover.py.

Against a real nats-server with the project's streams: what a consumer reads back from the
chunks stream is what these tests assert.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Mapping

import nats
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.js.api import PubAck

from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from schemas.errors import ErrorCode
from schemas.ids import new_action_id
from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.aip_wire import chunk_view
from worker.bus.publisher import BusPublisher, confirmed
from worker.errors import protocol_error
from worker.execution.chunk_stream import PRUNE_EVERY, ChunkStream, refusal_chunk
from worker.execution.leases import HeldLease, LeaseLost
from worker.store.keys import ActionKeys
from worker.store.lease_store import AcquireStatus, LeaseGrant
from worker.testing.services import ServiceHandle
from worker.trust.responses import sha256_hex
from worker.wire.chunks import decode_chunk, encode_chunk

ENDPOINT = "h1"


@pytest.fixture
async def nc(nats_server: ServiceHandle) -> AsyncIterator[Client]:
    client = await nats.connect(nats_server.url)
    await provision(client.jetstream(), Subjects(), [ENDPOINT], StreamPolicy(ack_wait_s=5.0))
    yield client
    await client.drain()


def _lease(action_id: str, *, fence: int, ttl_ms: int = 30_000) -> HeldLease:
    grant = LeaseGrant(
        status=AcquireStatus.ACQUIRED, fence=fence, other_owner="", expires_at_ms=0,
        attempted_fence=0, cancel_requested=False,
    )
    return HeldLease(ActionKeys.of(action_id), f"owner-{fence}", grant, ttl_ms=ttl_ms)


async def _stored(nc: Client, action_id: str) -> list[bytes]:
    """The chunks stream's messages for the Action, as stored."""
    js = nc.jetstream()
    sub = await js.subscribe(Subjects().chunks(ENDPOINT, action_id), ordered_consumer=True)
    chunks = []
    try:
        while True:
            chunks.append((await sub.next_msg(timeout=0.5)).data)
    except nats.errors.TimeoutError:
        return chunks
    finally:
        await sub.unsubscribe()


def _seqs(stored: list[bytes]) -> list[object]:
    return [chunk_view(data)["seq"] for data in stored]


async def test_only_the_first_terminal_chunk_counts_and_closes_the_stream(nc: Client) -> None:
    publisher = BusPublisher(nc.jetstream(), Subjects(), nc=nc)
    action_id = new_action_id()
    stream = await ChunkStream.open(
        publisher, _lease(action_id, fence=1), action_id=action_id, endpoint_id=ENDPOINT
    )
    await stream.emit(ChunkKind.DATA, {"n": 0})
    done = await stream.emit(ChunkKind.DONE, {"first": True})
    assert await stream.emit(ChunkKind.ERROR, {"second": True}) == done == 1
    closing = stream.closing(ChunkKind.DONE, {"made": "from the result"})
    assert (closing.seq, closing.payload) == (1, {"first": True})
    await stream.confirm()
    # The held terminal chunk is not published by the stream: the settle stores it with
    # the result and the Outbox publishes it (tests/integration/test_terminal_chunk.py).
    assert _seqs(await _stored(nc, action_id)) == [0]


async def test_a_lease_not_renewed_in_time_publishes_nothing(nc: Client) -> None:
    publisher = BusPublisher(nc.jetstream(), Subjects(), nc=nc)
    action_id = new_action_id()
    lease = _lease(action_id, fence=1, ttl_ms=1_000)
    stream = await ChunkStream.open(
        publisher, lease, action_id=action_id, endpoint_id=ENDPOINT
    )
    lease.renewed_at = time.monotonic() - 0.9  # a pause past 80 % of the TTL
    with pytest.raises(LeaseLost):
        await stream.emit(ChunkKind.DATA, {"n": 0})
    assert lease.lost == "lease not confirmed within its TTL"
    lease.renewed_at = time.monotonic()
    with pytest.raises(LeaseLost):  # lost stays lost, whatever renews later
        lease.check()
    assert await _stored(nc, action_id) == []


async def test_a_long_run_keeps_only_its_unconfirmed_chunks(nc: Client) -> None:
    publisher = BusPublisher(nc.jetstream(), Subjects(), nc=nc)
    action_id = new_action_id()
    stream = await ChunkStream.open(
        publisher, _lease(action_id, fence=1), action_id=action_id, endpoint_id=ENDPOINT
    )
    for n in range(5 * PRUNE_EVERY):
        await stream.emit(ChunkKind.DATA, {"n": n})
        await nc.flush()  # the PubAck of this chunk is back before the next one
        await asyncio.sleep(0.01)
    # Not the 40 chunks sent: the confirmed ones were let go along the way.
    assert stream.awaiting_confirmation < PRUNE_EVERY
    await stream.confirm()
    assert _seqs(await _stored(nc, action_id)) == list(range(5 * PRUNE_EVERY))


class _FailingFirst(BusPublisher):
    """Chunk 0's confirmation fails; every other chunk is confirmed at once."""

    def __init__(self, nc: Client) -> None:
        super().__init__(nc.jetstream(), Subjects())
        self.resent: list[int] = []

    async def chunk(
        self,
        chunk: StreamChunk,
        data: bytes | None = None,
        *,
        subject: str | None = None,
        sha256: str | None = None,
        mac: str | None = None,
        trace: Mapping[str, str] | None = None,
    ) -> asyncio.Future[PubAck]:
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        if chunk.seq == 0:
            future.set_exception(TimeoutError("no PubAck"))
        else:
            future.set_result(PubAck(stream="AIP_HERMES_CHUNKS", seq=chunk.seq + 1))
        return future

    async def chunk_once(
        self,
        chunk: StreamChunk,
        data: bytes,
        *,
        subject: str | None = None,
        mac: str | None = None,
    ) -> PubAck:
        self.resent.append(chunk.seq)
        return PubAck(stream="AIP_HERMES_CHUNKS", seq=chunk.seq + 1)


async def test_a_chunk_whose_confirmation_failed_is_kept_and_sent_again(nc: Client) -> None:
    publisher = _FailingFirst(nc)
    action_id = new_action_id()
    stream = await ChunkStream.open(
        publisher, _lease(action_id, fence=1), action_id=action_id, endpoint_id=ENDPOINT
    )
    for n in range(3 * PRUNE_EVERY):
        await stream.emit(ChunkKind.DATA, {"n": n})
    assert stream.awaiting_confirmation < PRUNE_EVERY  # not 24: chunk 0 and the newest
    await stream.confirm()
    assert publisher.resent == [0]


async def test_chunks_the_bus_refuses_are_held_in_order_and_sent_when_it_is_back(
    nc: Client,
) -> None:
    """JetStream not answering (here: the chunk stream deleted, so a publish has no
    responder, as when a full store made nats-server disable JetStream) must not end the
    run: the chunks are held, nothing overtakes them, `/ready`'s reason names the failure,
    and once the stream is back `confirm` sends them in seq order with the chain intact."""
    js = nc.jetstream()
    publisher = BusPublisher(js, Subjects(), nc=nc, confirm_timeout_s=1.0)
    action_id = new_action_id()
    stream = await ChunkStream.open(
        publisher, _lease(action_id, fence=1), action_id=action_id, endpoint_id=ENDPOINT
    )
    await stream.emit(ChunkKind.DATA, {"n": 0})
    await stream.confirm()
    assert publisher.health.reason() is None
    await js.delete_stream(Subjects().stream_name("chunks"))
    for n in range(1, 4):
        await stream.emit(ChunkKind.DATA, {"n": n})  # no exception: held, not failed
    await stream.confirm()
    reason = publisher.health.reason()
    assert reason is not None
    assert "JetStream is not answering" in reason
    owed = [chunk_view(line) for line in stream.owed.split(b"\n")]
    assert [c["seq"] for c in owed] == [1, 2, 3]
    await provision(js, Subjects(), [ENDPOINT], StreamPolicy(ack_wait_s=5.0))
    await stream.emit(ChunkKind.DATA, {"n": 4})  # still held: chunk 1 goes first
    await stream.confirm()
    assert stream.owed == b""
    assert publisher.health.reason() is None
    stored = await _stored(nc, action_id)
    assert _seqs(stored) == [1, 2, 3, 4]
    for before, after in itertools.pairwise(stored):
        assert chunk_view(after)["prev_sha256"] == sha256_hex(before)


def test_a_refused_action_s_stream_is_one_error_chunk_at_seq_0() -> None:
    action_id = new_action_id()
    error = protocol_error(ErrorCode.CONFIGURATION_OR_INPUT, "no", endpoint_id=ENDPOINT)
    chunk = refusal_chunk(action_id, ENDPOINT, error, 1234)
    assert (chunk.seq, chunk.kind, chunk.prev_sha256) == (0, ChunkKind.ERROR, None)
    assert encode_chunk(refusal_chunk(action_id, ENDPOINT, error, 1234)) == encode_chunk(chunk)


def test_a_chunk_encodes_to_the_same_bytes_every_time_and_back_from_its_decoding() -> None:
    """A chunk stream re-encodes a chunk to re-send it or to record the chain's head: the
    bytes (and so the hash the next chunk and the result name) must not change, and a
    decoded route chunk gives back the bytes it came from."""
    chunk = make_chunk(
        ChunkKind.ERROR,
        action_id=new_action_id(),
        endpoint_id=ENDPOINT,
        seq=7,
        ts_unix_ms=1_700_000_000_123,
        payload={"status": "failed", "ratio": 0.1 + 0.2, "big": 1e300, "text": "Grüße ✓ \u2028"},
        provider_event="run.failed",
        run_id="run_1",
        prev_sha256="0" * 64,
    )
    data = encode_chunk(chunk)
    assert encode_chunk(chunk) == data
    assert encode_chunk(decode_chunk(data)[0]) == data


def _reference_prune(
    pending: list[tuple[StreamChunk, asyncio.Future[PubAck]]], next_seq: int
) -> tuple[list[tuple[StreamChunk, asyncio.Future[PubAck]]], object]:
    """The prune as it was first written: filter, then walk back from the newest chunk to
    the frontier (the newest confirmed one before the first unconfirmed)."""
    kept = [p for p in pending if not confirmed(p[1])]
    first_open = kept[0][0].seq if kept else next_seq
    frontier = None
    for sent in reversed(pending):
        if sent[0].seq < first_open and confirmed(sent[1]):
            frontier = sent
            break
    return kept, frontier


@settings(max_examples=300)
@given(st.lists(st.sampled_from(["acked", "waiting", "failed", "cancelled"]), max_size=40))
async def test_the_prune_keeps_what_the_first_prune_kept(states: list[str]) -> None:
    """`ChunkStream._prune` (one walk to the first unconfirmed chunk, then a filter) keeps
    the same chunks and finds the same frontier as the filter-and-walk-back it replaced."""
    loop = asyncio.get_running_loop()
    action_id = new_action_id()
    stream = ChunkStream(
        BusPublisher(None, Subjects()),  # type: ignore[arg-type]  # publishes nothing here
        _lease(action_id, fence=1), action_id=action_id, endpoint_id=ENDPOINT,
    )
    pending = []
    for seq, state in enumerate(states):
        future: asyncio.Future[PubAck] = loop.create_future()
        if state == "acked":
            future.set_result(PubAck(stream="S", seq=seq + 1))
        elif state == "failed":
            future.set_exception(RuntimeError("refused"))
        elif state == "cancelled":
            future.cancel()
        chunk = make_chunk(ChunkKind.DATA, action_id=action_id, endpoint_id=ENDPOINT, seq=seq,
                           ts_unix_ms=1)
        pending.append((chunk, future))
    stream._pending, stream._seq = list(pending), len(states)
    kept, frontier = _reference_prune(pending, len(states))
    stream._prune()
    assert stream._pending == kept
    assert stream._frontier is frontier
    for _, future in pending:
        if future.done() and not future.cancelled():
            future.exception()  # retrieved: no "never retrieved" warning
