"""Receipts handed over before an unsafe request survive a kill right after it.

The operator's start is sent only after `AuditLog.hand_over` (`worker/operator/start.py`):
the bus server then holds the `start_claimed` receipt, so a worker killed once the start
left still leaves it on the audit stream. Here a real process emits a receipt and ends with
`os._exit` at once (kill -9's effect on what it buffered), with and without the hand-over,
against a real NATS server; and the bytes the server receives show that the hand-over's
PING follows what was published before it, so its PONG confirms them.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import nats
import pytest

from schemas.audit import ReceiptEvent
from subjects.grammar import Subjects
from tests.chaos.proxy import FaultProxy
from tests.integration.stack import ENDPOINT, provision_streams
from worker.bus.flush import flushed_in_order
from worker.bus.publisher import BusPublisher
from worker.client import AipClient
from worker.testing.services import ServiceHandle

REPO = Path(__file__).resolve().parents[2]

#: Emits one `start_claimed` receipt, hands it over when asked, and dies on the spot.
EMIT_AND_DIE = """
import asyncio, os, sys
import nats
from schemas.audit import ReceiptEvent
from subjects.grammar import Subjects
from worker.bus.audit import AuditLog
from worker.bus.publisher import BusPublisher

async def main(url, endpoint, action_id, hand_over):
    nc = await nats.connect(url)
    audit = AuditLog(BusPublisher(nc.jetstream(), Subjects(), nc=nc), "w-killed")
    audit.emit(ReceiptEvent.START_CLAIMED, action_id=action_id, endpoint_id=endpoint)
    if hand_over == "yes":
        await audit.hand_over()
    os._exit(137)

asyncio.run(main(*sys.argv[1:]))
"""


async def _emit_and_die(url: str, action_id: str, *, hand_over: bool) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        EMIT_AND_DIE,
        url,
        ENDPOINT,
        action_id,
        "yes" if hand_over else "no",
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert await asyncio.wait_for(proc.wait(), 60) == 137


@pytest.mark.parametrize("hand_over", [True, False])
async def test_a_receipt_handed_over_is_on_the_stream_after_a_kill(
    nats_server: ServiceHandle, hand_over: bool
) -> None:
    await provision_streams(nats_server.url)
    action_id = "act_" + ("a" if hand_over else "b") * 32
    await _emit_and_die(nats_server.url, action_id, hand_over=hand_over)
    reader = await nats.connect(nats_server.url)
    try:
        await asyncio.sleep(0.2)  # JetStream stores what the server received
        events = [r.event for r in await AipClient(reader).receipts(ENDPOINT, action_id)]
    finally:
        await reader.close()
    # The control: emitted but not handed over, the receipt dies in the process's queue.
    assert events == ([ReceiptEvent.START_CLAIMED] if hand_over else [])


@pytest.mark.parametrize("queued", ["publish", "subscribe"])
async def test_the_flush_ping_follows_what_was_queued_before_it(
    nats_server: ServiceHandle, queued: str
) -> None:
    # nats-py writes a flush's PING ahead of commands still queued for its flusher; a PONG
    # to that PING would confirm nothing about them (`worker.bus.flush`). A publish is the
    # hand-over's case (`BusPublisher.flushed`), a subscribe the stream wake-ups'.
    received = bytearray()
    port = int(nats_server.url.rsplit(":", 1)[1])
    proxy = await FaultProxy("nats", port, tap=received.extend).start()
    nc = await nats.connect(f"nats://127.0.0.1:{proxy.port}")
    try:
        await nc.flush()
        before = len(received)  # the connect's own CONNECT and PING
        if queued == "publish":
            await nc.publish("aip.test.hand_over", b"receipt")
            await BusPublisher(nc.jetstream(), Subjects(), nc=nc).flushed(1)
            command = b"PUB aip.test.hand_over "
        else:
            await nc.subscribe("aip.test.wake_up")
            await flushed_in_order(nc, 1)
            command = b"SUB aip.test.wake_up "
        after = bytes(received[before:])
    finally:
        await nc.close()
        await proxy.close()
    sent, ping = after.find(command), after.rfind(b"PING\r\n")
    assert sent >= 0, f"the {queued} had not reached the server: {after!r}"
    assert ping > sent, f"the PING went ahead of the {queued}: {after!r}"
