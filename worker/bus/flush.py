"""A NATS flush whose PONG confirms everything published before it.

nats-py's `Client.flush` writes its PING straight to the socket, ahead of the commands
still queued for its flusher task (`_pending`: every publish and subscribe made since the
flusher last ran). The server answers the PING before it has read them, so that PONG says
nothing about them: a receipt "handed over" could still sit in this process's buffer, and
a subscription "active on the server" might not be yet. `flushed_in_order` has the flusher
write the queue first and waits for it (`_flush_pending(force_flush=True)`, nats-py's own
path for a publish past its pending limit), then sends the PING behind it.
`tests/integration/test_receipt_hand_over.py` checks the order on the wire, so a nats-py
that changes either method fails there rather than quietly confirming too early.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NATS


async def flushed_in_order(nc: NATS, timeout_s: int) -> None:
    """Return once the server has answered a PING sent after everything this connection
    published or subscribed so far; raises `TimeoutError` (or nats-py's flush errors) when
    that takes longer than `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        await nc._flush_pending(force_flush=True)
        await nc.flush(timeout=timeout_s)
