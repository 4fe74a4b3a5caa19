"""The connector host's chunk sink: a streaming Action's chunks, to the GetAIP central
(aip-1.0-wire.md §3.6, "Stream chunks"). Which chunks go, and when, is the chunk
follower's (worker/gateway/chunk_follower.py, `Release.LIVE`); this module delivers one.

Each chunk of the child is POSTed to the Action's central callback
(`{AIPD_AIP_CENTRAL_URL}/aip/v1/connector-callbacks`) as one Envelope signed by the gateway
key: `message_type` `aip.core.v1.stream_chunk`, `to` the callback's
`connector_callback_recipient`, `security.connector_callback` the pinned route, and the
body the AIP StreamChunk as the worker published it (worker/wire/chunks.py `chunk_body`)
named by the requester's Action id. The `Idempotency-Key` header is the Envelope's
`message_id`, derived from the Action and the sequence, so a resent chunk is the same
message to the central.

Why chunks are resent and then given up: the central acknowledges each one (an
`event_stream`); a chunk it never acknowledged is tried `ATTEMPTS` times, after which
`send` raises `NotDelivered`: the follower sends no later chunk (a gap would mislead), and
the Action's final `action_result` (the answer to the hop) still carries the outcome.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from typing import Any, Final

import httpx

from worker.aip.canonical import canonical_bytes
from worker.aip.envelope import now_timestamp
from worker.aip.signing import AipSigner, sign_envelope
from worker.errors import NotDelivered

CHUNK: Final = "aip.core.v1.stream_chunk"
CONTENT_TYPE: Final = "application/aip+json"
ATTEMPTS: Final = 3
RETRY_S: Final = 0.2
TIMEOUT_S: Final = 5.0


def chunk_message_id(action_id: str, sequence: int) -> str:
    """The same `msg_…` id for the same chunk, however often it is sent."""
    digest = hashlib.sha256(f"{action_id}\0{sequence}".encode()).hexdigest()
    return "msg_" + digest[:32]


class ChunkStream:
    """Delivers the chunks of one Action to its central callback (a `ChunkSink`)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        signer: AipSigner,
        sender: Mapping[str, Any],
        *,
        target: str,
        recipient: Mapping[str, Any],
        route: Mapping[str, Any],
        correlation_id: str | None,
    ) -> None:
        self.client = client
        self.signer = signer
        self.sender = sender
        self.target = target
        self.recipient = recipient
        self.route = route
        self.correlation_id = correlation_id
        self.sent = 0

    def envelope(self, chunk: Mapping[str, Any]) -> bytes:
        """The signed Envelope of one AIP StreamChunk body."""
        envelope: dict[str, Any] = {
            "aip_version": "1.0",
            "message_type": CHUNK,
            "message_id": chunk_message_id(str(chunk["action_id"]), int(chunk["sequence"])),
            "sent_at": now_timestamp(),
            "to": dict(self.recipient),
            "body": {"stream_chunk": dict(chunk)},
            "security": {"connector_callback": dict(self.route)},
        }
        if self.correlation_id is not None:
            envelope["correlation_id"] = self.correlation_id
        return canonical_bytes(sign_envelope(envelope, self.signer, self.sender))

    async def send(self, chunk: Mapping[str, Any]) -> None:
        """Deliver one chunk, tried `ATTEMPTS` times; `NotDelivered` when the central never
        acknowledged it."""
        data = self.envelope(chunk)
        key = chunk_message_id(str(chunk["action_id"]), int(chunk["sequence"]))
        headers = {
            "content-type": CONTENT_TYPE,
            "aip-message-type": CHUNK,
            "idempotency-key": key,
        }
        for attempt in range(ATTEMPTS):
            try:
                answer = await self.client.post(
                    self.target, content=data, headers=headers, timeout=TIMEOUT_S
                )
            except httpx.HTTPError as exc:
                problem = type(exc).__name__
            else:
                if 200 <= answer.status_code < 300:
                    self.sent += 1
                    return
                problem = f"HTTP {answer.status_code}"
            if attempt + 1 < ATTEMPTS:
                await asyncio.sleep(RETRY_S * (attempt + 1))
        raise NotDelivered(f"the central callback did not accept it ({problem})")
