"""The cheaper hot path keeps every promise of the one it replaced (benchmark issue #5)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.js.api import PubAck

from schemas.audit import Receipt, ReceiptEvent
from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from schemas.ids import new_action_id
from subjects.grammar import Subjects, chunk_msg_id
from tests.aip_wire import aip_receipt, receipt_fields
from worker.bus.audit import SEAL_AFTER_S, AuditLog
from worker.bus.publisher import MSG_ID, BusPublisher
from worker.execution.chunk_stream import CONFIRM_BATCH, MAX_UNCONFIRMED, ChunkStream
from worker.execution.leases import HeldLease
from worker.store.connection import open_redis
from worker.store.keys import ActionKeys
from worker.store.lease_store import AcquireStatus, LeaseGrant, LeaseStore
from worker.testing.services import ServiceHandle
from worker.trust.responses import ResponseSigner, sha256_hex
from worker.trust.signing import generate_keypair, write_seed_file
from worker.wire.chunks import encode_chunk


@pytest.fixture
async def redis(redis_server: ServiceHandle) -> AsyncIterator[Any]:
    client = open_redis(redis_server.url, max_connections=3)
    yield client
    await client.aclose()


async def test_concurrent_first_calls_load_each_script_once(redis: Any) -> None:
    await redis.script_flush()
    store = LeaseStore(redis)
    loads: list[str] = []
    original = redis.script_load

    async def counted(script: str) -> Any:
        loads.append(script)
        return await original(script)

    redis.script_load = counted
    keys = [ActionKeys.of(new_action_id()) for _ in range(20)]
    grants = await asyncio.gather(*(store.acquire(k, f"w#{i}", 5_000, "fp")
                                    for i, k in enumerate(keys)))
    assert {g.status for g in grants} == {AcquireStatus.ACQUIRED}
    assert all(g.now_ms > 0 for g in grants)
    assert len(loads) == len(set(loads)) == len(store.scripts._scripts)
    # After a restart emptied the script cache, a call reloads its script by itself.
    await redis.script_flush()
    again = await store.acquire(ActionKeys.of(new_action_id()), "w#x", 5_000, "fp")
    assert again.status is AcquireStatus.ACQUIRED


class _FakeJs:
    """Records publishes; `publish_async` futures are completed by the test."""

    def __init__(self) -> None:
        self.async_sent: list[tuple[str, dict[str, str]]] = []
        self.awaited: list[tuple[str, dict[str, str]]] = []
        self.futures: list[asyncio.Future[PubAck]] = []

    async def publish_async(self, subject: str, payload: bytes, **kw: Any) -> Any:
        self.async_sent.append((subject, kw["headers"]))
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future

    async def publish(self, subject: str, payload: bytes, **kw: Any) -> PubAck:
        self.awaited.append((subject, kw["headers"]))
        return PubAck(stream="S", seq=len(self.awaited))


def _chunk(action_id: str, seq: int) -> StreamChunk:
    return make_chunk(
        ChunkKind.DATA, action_id=action_id, endpoint_id="h1", seq=seq, ts_unix_ms=1,
        payload={"delta": str(seq)},
    )


async def test_a_batch_confirmation_resends_exactly_the_unconfirmed_chunks() -> None:
    js = _FakeJs()
    publisher = BusPublisher(js, Subjects(), confirm_timeout_s=0.1)  # type: ignore[arg-type]
    action_id = new_action_id()
    chunks = [_chunk(action_id, s) for s in range(4)]
    pending = [(c, encode_chunk(c), await publisher.chunk(c, encode_chunk(c))) for c in chunks]
    js.futures[0].set_result(PubAck(stream="S", seq=1))
    js.futures[1].set_exception(TimeoutError())
    js.futures[3].set_result(PubAck(stream="S", seq=2))
    await publisher.confirm(pending)  # chunk 2 never confirms: cancelled, then re-sent
    # Re-sent under their content-bound ids (seq and the bytes' hash), as first sent.
    assert [h[MSG_ID] for _, h in js.awaited] == [
        chunk_msg_id(action_id, chunk.seq, sha256_hex(data)) for chunk, data, _ in pending[1:3]
    ]
    assert js.futures[2].cancelled()  # its in-flight slot is given back


class _RecordingPublisher:
    def __init__(self, signer: ResponseSigner | None = None) -> None:
        self.sent: list[str] = []
        self.signer = signer
        #: What a signing publisher sent: the exact bytes, and whether they were signed.
        self.payloads: list[tuple[bytes, bool]] = []

    async def receipt(self, receipt: Any, payload: bytes | None = None) -> None:
        await asyncio.sleep(0)
        self.sent.append(receipt.receipt_id)
        if payload is not None:
            signed = "signature" in json.loads(payload).get("security", {})
            self.payloads.append((payload, signed))


async def test_receipts_go_out_in_emission_order_and_drain_waits_for_them() -> None:
    publisher = _RecordingPublisher()
    audit = AuditLog(publisher, "w1")  # type: ignore[arg-type]
    action_id = new_action_id()
    for _ in range(5):
        audit.emit(ReceiptEvent.RECEIVED, action_id=action_id, endpoint_id="h1")
    await asyncio.sleep(0)
    audit.emit(ReceiptEvent.SETTLED, action_id=action_id, endpoint_id="h1")
    await audit.drain()
    assert [r.rsplit(":", 1)[1] for r in publisher.sent] == ["0", "1", "2", "3", "4", "5"]
    assert publisher.sent[-1].startswith(f"{action_id}:settled")
    audit.emit(ReceiptEvent.SETTLED, action_id=action_id, endpoint_id="h1")  # a new sender
    await audit.drain()
    assert len(publisher.sent) == 7


async def test_receipts_emitted_together_share_one_signature_and_link_back(
    tmp_path: Path,
) -> None:
    """A segment: every receipt is sent at once, naming the AIP hash of the one before it
    (`previous_hash`, recomputed here from the rules); a signed `segment_sealed` receipt
    names the last one once no next one came for SEAL_AFTER_S (or at `seal`); a later
    receipt opens a new segment."""
    seed_file = tmp_path / "worker.seed"
    write_seed_file(seed_file, generate_keypair().seed)
    publisher = _RecordingPublisher(ResponseSigner.load(seed_file))
    audit = AuditLog(publisher, "w1")  # type: ignore[arg-type]
    action_id = new_action_id()
    for event in (ReceiptEvent.RECEIVED, ReceiptEvent.ADMITTED, ReceiptEvent.LEASE_ACQUIRED):
        audit.emit(event, action_id=action_id, endpoint_id="h1")
    await asyncio.sleep(0.01)
    # Nothing is held back: a process killed now leaves all three on the stream.
    assert [signed for _, signed in publisher.payloads] == [False, False, False]
    await asyncio.sleep(SEAL_AFTER_S * 3)
    audit.emit(ReceiptEvent.SETTLED, action_id=action_id, endpoint_id="h1")
    await audit.drain()
    sent = [
        (msgspec.convert(receipt_fields(p), Receipt), receipt_fields(p), signed)
        for p, signed in publisher.payloads
    ]
    assert [(r.event, signed) for r, _, signed in sent] == [
        (ReceiptEvent.RECEIVED, False),
        (ReceiptEvent.ADMITTED, False),
        (ReceiptEvent.LEASE_ACQUIRED, False),
        (ReceiptEvent.SEGMENT_SEALED, True),
        (ReceiptEvent.SETTLED, False),
        (ReceiptEvent.SEGMENT_SEALED, True),
    ]
    assert sent[0][0].prev_sha256 is None
    for before, after in itertools.pairwise(sent[:4]):
        assert after[0].prev_sha256 == aip_receipt(before[1])["hash"]
    assert sent[4][0].prev_sha256 is None  # emitted after the seal: a segment of its own
    assert sent[5][0].prev_sha256 == aip_receipt(sent[4][1])["hash"]

    # Before a result is published its segment is sealed at once, not SEAL_AFTER_S later:
    # the last receipt still queued is itself sent signed (no `segment_sealed` after it),
    # and it links back to the one before it.
    publisher.payloads.clear()
    audit.emit(ReceiptEvent.RUN_BOUND, action_id=action_id, endpoint_id="h1")
    audit.emit(ReceiptEvent.SETTLED, action_id=action_id, endpoint_id="h1")
    await audit.seal(action_id)
    sealed = [(receipt_fields(p), signed) for p, signed in publisher.payloads]
    assert [(f["event"], signed) for f, signed in sealed] == [
        ("run_bound", False),
        ("settled", True),
    ]
    assert msgspec.convert(sealed[1][0], Receipt).prev_sha256 == aip_receipt(sealed[0][0])["hash"]
    # A segment already sent when its result is due is closed by a signed `segment_sealed`.
    publisher.payloads.clear()
    audit.emit(ReceiptEvent.RUN_BOUND, action_id=action_id, endpoint_id="h1")
    await asyncio.sleep(0.01)
    await audit.seal(action_id)
    assert [(receipt_fields(p)["event"], signed) for p, signed in publisher.payloads] == [
        ("run_bound", False),
        ("segment_sealed", True),
    ]
    # A receipt that ends a segment (a lease released or lost) is sent signed at once.
    publisher.payloads.clear()
    audit.emit(ReceiptEvent.LEASE_ACQUIRED, action_id=action_id, endpoint_id="h1")
    audit.emit(ReceiptEvent.LEASE_LOST, action_id=action_id, endpoint_id="h1")
    await asyncio.sleep(0.01)
    assert [signed for _, signed in publisher.payloads] == [False, True]


async def test_a_receipt_that_cannot_be_framed_is_skipped_and_the_chain_stays_whole(
    tmp_path: Path,
) -> None:
    """A receipt whose details cannot be printed as AIP JSON (a lone surrogate) is logged
    and skipped; the receipts queued with it still go, the next one links to the last one
    framed, and `seal` does not raise."""
    seed_file = tmp_path / "worker.seed"
    write_seed_file(seed_file, generate_keypair().seed)
    publisher = _RecordingPublisher(ResponseSigner.load(seed_file))
    audit = AuditLog(publisher, "w1")  # type: ignore[arg-type]
    action_id = new_action_id()
    audit.emit(ReceiptEvent.RECEIVED, action_id=action_id, endpoint_id="h1")
    audit.emit(ReceiptEvent.ADMITTED, action_id=action_id, endpoint_id="h1", note="\ud800")
    audit.emit(ReceiptEvent.SETTLED, action_id=action_id, endpoint_id="h1")
    await audit.seal(action_id)
    sent = [(receipt_fields(p), signed) for p, signed in publisher.payloads]
    assert [(f["event"], signed) for f, signed in sent] == [
        ("received", False),
        ("settled", True),
    ]
    assert msgspec.convert(sent[1][0], Receipt).prev_sha256 == aip_receipt(sent[0][0])["hash"]
    await audit.drain()


def _held_lease(action_id: str) -> HeldLease:
    grant = LeaseGrant(
        status=AcquireStatus.ACQUIRED, fence=1, other_owner="", expires_at_ms=0,
        attempted_fence=0, cancel_requested=False,
    )
    return HeldLease(ActionKeys.of(action_id), "owner-1", grant, ttl_ms=30_000)


async def _streaming(count: int, js: _FakeJs) -> tuple[ChunkStream, str]:
    action_id = new_action_id()
    publisher = BusPublisher(js, Subjects(), confirm_timeout_s=0.05)  # type: ignore[arg-type]
    stream = ChunkStream(publisher, _held_lease(action_id), action_id=action_id, endpoint_id="h1")
    for n in range(count):
        await stream.emit(ChunkKind.DATA, {"n": n})
    return stream, action_id


async def test_a_streaming_run_never_waits_for_confirmations_still_on_their_way() -> None:
    """Past a batch, `emit` collects what has arrived; the newest chunks are not waited
    for (a wait would time out here and re-send them)."""
    js = _FakeJs()
    stream, _ = await _streaming(CONFIRM_BATCH + 10, js)
    assert js.awaited == []
    assert not any(f.cancelled() for f in js.futures)
    for future in js.futures:
        future.set_result(PubAck(stream="S", seq=1))
    await stream.confirm()
    assert js.awaited == []


async def test_a_failed_chunk_is_re_sent_while_the_run_still_streams() -> None:
    js = _FakeJs()
    stream, action_id = await _streaming(CONFIRM_BATCH - 1, js)
    for n, future in enumerate(js.futures):
        if n == 7:
            future.set_exception(TimeoutError())
        else:
            future.set_result(PubAck(stream="S", seq=n))
    await stream.emit(ChunkKind.DATA, {"n": "next"})  # the batch is collected here
    assert [h[MSG_ID].rsplit(":", 1)[0] for _, h in js.awaited] == [f"{action_id}:7"]


async def test_a_confirmation_that_never_comes_is_given_up_and_its_chunk_re_sent() -> None:
    """The oldest chunk's confirmation is lost: once `MAX_UNCONFIRMED` chunks wait behind
    it, the oldest batch is waited for, the lost one cancelled (its slot freed) and re-sent;
    the later ones, confirmed meanwhile, are not."""
    js = _FakeJs()
    stream, action_id = await _streaming(1, js)
    for n in range(1, MAX_UNCONFIRMED - 1):
        await stream.emit(ChunkKind.DATA, {"n": n})
        js.futures[-1].set_result(PubAck(stream="S", seq=n))
    assert js.awaited == []
    await stream.emit(ChunkKind.DATA, {"n": "one too many"})
    assert [h[MSG_ID].rsplit(":", 1)[0] for _, h in js.awaited] == [f"{action_id}:0"]
    assert js.futures[0].cancelled()
