"""The HTTP part of one Action, as every peer does it: the same stack and the same requests.

`POST /v1/runs` with the body the operator sends, then the run's single-use SSE stream to
its terminal event. Peers use httpx + httpx-sse over the `httpx-aiohttp` transport, the
worker's own stack
(docs/architecture.md §7), so a difference in the tables is the framework's, not the
HTTP client's. The peer job message is the signed Action envelope itself, so every system
decodes the same bytes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
from httpx_aiohttp import AiohttpTransport
from httpx_sse import aconnect_sse

from worker.aip.signing import AipSigner
from worker.operator.policy import BUILTIN_INSTRUCTIONS
from worker.operator.start import PAYLOAD_KIND
from worker.wire.envelopes import open_envelope, seal

TERMINAL_EVENTS = frozenset({"run.completed", "run.failed", "run.cancelled"})
_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()

ACTION = frozenset({"aip.core.v1.action"})
CHUNK = "aip.core.v1.stream_chunk"
RESULT = "aip.core.v1.action_result"
#: The sender every system's chunks and results name, as the worker's do.
WORKER = {"id": "agent:hermes_operator:h1", "kind": "agent"}
#: The key the raw loop and the peers sign results with (the worker uses its response key).
RESULT_SIGNER = AipSigner.from_seed(bytes(range(32)))

OnEvent = Callable[[dict[str, Any]], Awaitable[None]]


class Job(msgspec.Struct, frozen=True):
    """What a peer needs from an Action envelope (unknown fields ignored)."""

    id: str
    input: dict[str, Any]


class _Body(msgspec.Struct, frozen=True):
    action: Job


class _ActionEnvelope(msgspec.Struct, frozen=True):
    """What a peer reads of an AIP Action Envelope (the rest ignored, as a peer would)."""

    body: _Body


_envelope_decoder = msgspec.json.Decoder(_ActionEnvelope)


def job_of(envelope: bytes) -> Job:
    """A peer's read of the Action Envelope: parse it and take the Action's id and input
    (no signature check: the peers have no trust layer, as before the AIP wire)."""
    return _envelope_decoder.decode(envelope).body.action


def job_of_value(envelope: dict[str, Any]) -> Job:
    """`job_of` for a framework that already parsed the JSON (FastStream)."""
    action = envelope["body"]["action"]
    return Job(id=action["id"], input=action["input"])


def verified_job(envelope: bytes) -> Job:
    """The raw loop's read: the Envelope opened and its AIP signature verified, as the
    worker's intake does before anything else (worker.wire.envelopes.open_envelope)."""
    opened = open_envelope(envelope, message_types=ACTION)
    if opened.verified is None:
        raise ValueError("an unsigned Action Envelope")
    return Job(id=opened.payload["id"], input=opened.payload["input"])


def new_client(url: str, api_key: str, *, max_connections: int = 512) -> httpx.AsyncClient:
    """One shared client per process, as the worker has one per endpoint."""
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections
    )
    return httpx.AsyncClient(
        base_url=url,
        transport=AiohttpTransport(limits=limits, trust_env=False),
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=httpx.Timeout(30.0),
        trust_env=False,
    )


def run_body(job: Job) -> bytes:
    """The `POST /v1/runs` body the operator sends for this objective (same size, same words)."""
    request_input = {
        "kind": PAYLOAD_KIND,
        "operator_action_id": job.id,
        "objective": job.input.get("objective", ""),
        "context": job.input.get("context"),
        "candidate_capabilities": job.input.get("candidate_capabilities", []),
        "constraints": job.input.get("constraints", {}),
    }
    return _encode.encode(
        {
            "input": _encode.encode(request_input).decode(),
            "session_id": f"aip-operator-{job.id}",
            "instructions": BUILTIN_INSTRUCTIONS,
        }
    )


async def start_run(client: httpx.AsyncClient, job: Job) -> str:
    response = await client.post(
        "/v1/runs", content=run_body(job), headers={"Content-Type": "application/json"}
    )
    response.raise_for_status()
    run_id = _decode.decode(response.content)["run_id"]
    assert isinstance(run_id, str)
    return run_id


async def follow_run(client: httpx.AsyncClient, run_id: str, on_event: OnEvent) -> str:
    """Hand every event to `on_event` in order; returns the terminal event's name."""
    async with aconnect_sse(client, "GET", f"/v1/runs/{run_id}/events") as source:
        async for sse in source.aiter_sse():
            event = _decode.decode(sse.data)
            await on_event(event)
            name = event.get("event")
            if name in TERMINAL_EVENTS:
                return str(name)
    raise RuntimeError(f"run {run_id} stream closed without a terminal event")


@dataclass
class ChunkChain:
    """One Action's chunks as AIP `stream_chunk` Envelopes, the wire work the worker does for
    each (docs/publishing.md "Chunks"): unsigned, each naming the sha256 of the previous
    one's exact bytes, so every system publishes the same bytes at the same cost."""

    action_id: str
    run_id: str
    sequence: int = 0
    previous: str | None = None
    last: bytes = b""

    def next(self, kind: str, event: dict[str, Any] | None, *, whole: bool = False) -> bytes:
        """The next chunk: the event's `delta`, as the operator relays it (`whole`: the
        event itself, as the raw relay does)."""
        extension: dict[str, Any] = {
            "endpoint_id": "h1",
            "run_id": self.run_id,
            "ts_unix_ms": time.time_ns() // 1_000_000,
        }
        if self.previous is not None:
            extension["prev_sha256"] = self.previous
        payload: dict[str, Any] = {
            "action_id": self.action_id,
            "sequence": self.sequence,
            "kind": kind,
            "data": {"hermes_operator": _relayed(event, whole)},
        }
        self.last = seal(
            CHUNK,
            payload,
            sender=WORKER,
            signer=None,
            extension=extension,
        )
        self.previous = hashlib.sha256(self.last).hexdigest()
        self.sequence += 1
        return self.last


def _relayed(event: dict[str, Any] | None, whole: bool) -> dict[str, Any]:
    if event is None:
        return {}
    return event if whole else {"delta": event.get("delta")}


def result_bytes(
    action_id: str, status: str, worker_id: str, fence: int, last_chunk: bytes = b""
) -> bytes:
    """The signed `action_result` Envelope of one Action, as the worker seals it."""
    extension: dict[str, Any] = {
        "capability": "cap:hermes_agent:h1:operator",
        "endpoint_id": "h1",
        "settled_by": worker_id,
        "fence": fence,
        "settled_at_unix_ms": time.time_ns() // 1_000_000,
    }
    if last_chunk:
        extension["last_chunk_sha256"] = hashlib.sha256(last_chunk).hexdigest()
    payload = {"action_id": action_id, "status": status, "output": {"run_status": status}}
    return seal(RESULT, payload, sender=WORKER, signer=RESULT_SIGNER, extension=extension)
