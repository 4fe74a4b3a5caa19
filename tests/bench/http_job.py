"""The HTTP part of one Action, as every peer does it: the same stack and the same requests.

`POST /v1/runs` with the body the operator sends, then the run's single-use SSE stream to
its terminal event. Peers use httpx + httpx-sse over the `httpx-aiohttp` transport, the
worker's own stack
(docs/architecture.md §7), so a difference in the tables is the framework's, not the
HTTP client's. The peer job message is the signed Action envelope itself, so every system
decodes the same bytes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import msgspec
from httpx_aiohttp import AiohttpTransport
from httpx_sse import aconnect_sse

from worker.operator.policy import BUILTIN_INSTRUCTIONS
from worker.operator.start import PAYLOAD_KIND

TERMINAL_EVENTS = frozenset({"run.completed", "run.failed", "run.cancelled"})
_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()

OnEvent = Callable[[dict[str, Any]], Awaitable[None]]


class Job(msgspec.Struct, frozen=True):
    """What a peer needs from an Action envelope (unknown fields ignored)."""

    id: str
    input: dict[str, Any]


job_decoder = msgspec.json.Decoder(Job)


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


def chunk_bytes(
    action_id: str, seq: int, kind: str, event: dict[str, Any] | None, run_id: str
) -> bytes:
    """A chunk shaped like the worker's StreamChunk, so every system publishes the same size."""
    return _encode.encode(
        {
            "action_id": action_id,
            "endpoint_id": "h1",
            "seq": seq,
            "kind": kind,
            "provider_event": None if event is None else event.get("event"),
            "run_id": run_id,
            "payload": None if event is None else {"delta": event.get("delta")},
            "ts_unix_ms": time.time_ns() // 1_000_000,
        }
    )


def result_bytes(action_id: str, status: str, worker_id: str, fence: int) -> bytes:
    return _encode.encode(
        {
            "action_id": action_id,
            "capability": "cap:hermes_agent:h1:operator",
            "endpoint_id": "h1",
            "status": status,
            "output": {"run_status": status},
            "settled_by": worker_id,
            "fence": fence,
            "settled_at_unix_ms": time.time_ns() // 1_000_000,
        }
    )
