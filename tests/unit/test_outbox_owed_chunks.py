"""The Outbox republishes the chunks the bus refused while an Action ran, before its
terminal chunk, and only those the stream does not hold yet (worker/pipeline/outbox.py).

Against a real nats-server with the project's streams and a duplicate window shorter than
the wait, so a republish that sent everything again without looking would store copies.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client

from schemas.action import Action, Identity
from schemas.chunk import ChunkKind, make_chunk
from schemas.ids import capability_id, new_action_id
from schemas.result import ActionResult, ResultStatus
from subjects.grammar import Subjects, chunk_msg_id
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.aip_wire import result_view
from worker.bus.audit import AuditLog
from worker.bus.publisher import BusPublisher
from worker.metrics import Metrics
from worker.pipeline.outbox import Outbox, Settled
from worker.testing.services import ServiceHandle
from worker.trust.responses import sha256_hex
from worker.wire.chunks import encode_chunk
from worker.wire.results import encode_result

ENDPOINT = "h1"


@pytest.fixture
async def nc(nats_server: ServiceHandle) -> AsyncIterator[Client]:
    client = await nats.connect(nats_server.url)
    policy = StreamPolicy(ack_wait_s=5.0, duplicate_window_s=0.5)
    await provision(client.jetstream(), Subjects(), [ENDPOINT], policy)
    yield client
    await client.drain()


def _chain(action_id: str, count: int) -> list[bytes]:
    """`count` chunks of one Action, the last one terminal, each naming the one before."""
    chunks: list[bytes] = []
    for seq in range(count):
        kind = ChunkKind.DONE if seq == count - 1 else ChunkKind.DATA
        chunk = make_chunk(
            kind,
            action_id=action_id,
            endpoint_id=ENDPOINT,
            seq=seq,
            ts_unix_ms=1_700_000_000_000 + seq,
            payload={"status": "completed"} if kind is ChunkKind.DONE else {"n": seq},
            prev_sha256=sha256_hex(chunks[-1]) if chunks else None,
        )
        chunks.append(encode_chunk(chunk))
    return chunks


async def _stored(nc: Client, subject: str) -> list[bytes]:
    sub = await nc.jetstream().subscribe(subject, ordered_consumer=True)
    out = []
    try:
        while True:
            out.append((await sub.next_msg(timeout=0.5)).data)
    except nats.errors.TimeoutError:
        return out
    finally:
        await sub.unsubscribe()


async def test_owed_chunks_go_out_before_the_terminal_one_without_copies(nc: Client) -> None:
    subjects = Subjects()
    publisher = BusPublisher(nc.jetstream(), subjects, nc=nc)
    outbox = Outbox(
        publisher=publisher,
        subjects=subjects,
        audit=AuditLog(None, "w1"),
        metrics=Metrics(worker_id="w1"),
        outputs=[],
    )
    action_id = new_action_id()
    action = Action(
        id=action_id,
        capability=capability_id(ENDPOINT, "chat_stream"),
        input={},
        identity=Identity(principal_id="user:a", principal_kind="user", credential_revision=1),
        created_at_unix_ms=1,
    )
    chunks = _chain(action_id, 6)  # 0 and 1 reached the bus; 2-4 were refused; 5 terminal
    subject = subjects.chunks(ENDPOINT, action_id)
    for seq in (0, 1):
        await nc.jetstream().publish(
            subject,
            chunks[seq],
            headers={"Nats-Msg-Id": chunk_msg_id(action_id, seq, sha256_hex(chunks[seq]))},
        )
    result = encode_result(
        ActionResult(
            action_id=action_id,
            capability=action.capability,
            endpoint_id=ENDPOINT,
            status=ResultStatus.COMPLETED,
            settled_by="w1",
            fence=1,
            settled_at_unix_ms=1,
            last_chunk_sha256=sha256_hex(chunks[5]),
            action_sha256="0" * 64,
        ),
        action=action,
        signer=None,
        endpoint_id=ENDPOINT,
    )
    # A crash after chunk 2 of the owed ones was stored: the next republish sends 3 and 4.
    await nc.jetstream().publish(
        subject,
        chunks[2],
        headers={"Nats-Msg-Id": chunk_msg_id(action_id, 2, sha256_hex(chunks[2]))},
    )
    await asyncio.sleep(0.7)  # past the duplicate window: only looking first avoids copies
    settled = Settled(result, chunks[5], b"\n".join(chunks[2:5]))
    await outbox.republish([], action, ENDPOINT, settled)
    stored = await _stored(nc, subject)
    assert stored == chunks
    [on_bus] = await _stored(nc, subjects.results(ENDPOINT, action_id))
    assert on_bus == result  # the stored bytes, as they are
    assert result_view(on_bus)["last_chunk_sha256"] == sha256_hex(stored[-1])
    # Again, the result on the bus: nothing more is sent.
    await asyncio.sleep(0.7)
    await outbox.republish([], action, ENDPOINT, settled)
    assert await _stored(nc, subject) == chunks
