"""The native NATS binding's streaming Actions and events pages, by an independent client.

Real NATS and Redis, a worker serving h1 over the fake Hermes, a gateway serving the binding.
The client builds each request by the AIP rules alone (tests/aip_actions.py), listens on its
own callback subject, and checks every chunk Envelope it receives there by hand: PyNaCl over
the canonical bytes by the gateway key, the reply recipe's correlation, jsonschema against
schemas/json/aip.core.v1.stream_chunk.json, sequence from 0 in order, the terminal `done`
last, then the final `action_result` as the answer. A long stream (a run's events flooded
by the fake Hermes) and a forged chunk on the child's chunk subject test the chunk follower
(worker/gateway/chunk_follower.py) under this binding's release policy.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import nacl.signing
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from schemas.chunk import ChunkKind, make_chunk
from schemas.result import ResultStatus
from tests.aip_actions import did_of, sign
from worker.gateway.service import namespaced_action_id
from worker.testing.fake_hermes.faults import EventsFlood, RouteDelay
from worker.testing.scenario import SLOW_REPLY
from worker.wire.chunks import encode_chunk

from .conftest import H1, GatewayStack
from .test_native_nats import (
    CALLER,
    SCHEMAS,
    action,
    actions_last_seq,
    ask,
    check_answer,
    check_signed,
    error_code,
    frame,
    serve_native,
)

pytestmark = pytest.mark.asyncio

CHAT_STREAM = "cap:hermes_agent:h1:chat_stream"
RUN_EVENTS = "cap:hermes_agent:h1:run_events"
NATS_PROFILE = "aip.native.nats.v1"
#: One-character deltas the fake Hermes puts before a flooded run's own events.
FLOOD = 250
#: What the forged chunk says (no real chunk says it).
FORGED = "FORGED-BY-THE-TEST"


async def flooded_run(gs: GatewayStack) -> str:
    """A run of h1 (started and approved on the bus by an untenanted user, like the
    binding's principal) whose event stream, when read, starts with FLOOD extra deltas."""
    stack = gs.stack
    start = stack.action("run_start", {"input": "a long stream"})
    await stack.approve(start)
    result = await (await stack.publish(start)).result(timeout_s=20)
    assert result.status is ResultStatus.COMPLETED, result
    run_id = str(result.output["run_id"])
    assert stack.fake is not None
    stack.fake.faults.add(EventsFlood(run_id=run_id, count=FLOOD))
    return run_id


class Forger:
    """Watches one child's chunk subject and, once a real chunk at `after` or later is
    there, publishes a chunk of the child at the next seq: naming a wrong previous hash
    (`linked` false: provably off the chain), or the real chunk's own hash (`linked`: a
    forgery that links, stored before the real next chunk because the worker is paused
    meanwhile). Published with no `Nats-Msg-Id`, so it is stored beside the real chunk of
    that seq, never instead of it."""

    def __init__(
        self, gs: GatewayStack, action_id: str, *, after: int = 2, linked: bool = False
    ) -> None:
        self.gs = gs
        self.nc = gs.stack.nc
        self.bus_id = namespaced_action_id(H1, None, action_id)
        self.subject = f"aip.hermes.h1.chunks.{self.bus_id}"
        self.after = after
        self.linked = linked
        self.reached: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self._sub: Subscription | None = None

    async def start(self) -> None:
        async def seen(msg: Msg) -> None:
            chunk = json.loads(msg.data)["body"]["stream_chunk"]
            self.reached.put_nowait((int(chunk["sequence"]), msg.data))

        self._sub = await self.nc.subscribe(self.subject, cb=seen)
        await self.nc.flush()

    async def forge(self) -> int:
        """Wait for the real chunk, publish the forgery; its seq."""
        while True:
            seq, data = await asyncio.wait_for(self.reached.get(), 20)
            if seq >= self.after:
                break
        assert self._sub is not None
        await self._sub.unsubscribe()
        forged = make_chunk(
            ChunkKind.DATA,
            action_id=self.bus_id,
            endpoint_id="h1",
            seq=seq + 1,
            ts_unix_ms=int(time.time() * 1000),
            payload={"delta": FORGED},
            prev_sha256=hashlib.sha256(data).hexdigest() if self.linked else "0" * 64,
        )
        (worker,) = self.gs.stack.workers
        worker.pause()  # its next chunk is stored after the forgery
        try:
            await self.nc.jetstream().publish(self.subject, encode_chunk(forged))
        finally:
            worker.resume()
        return seq + 1


async def chain_breaks(gs: GatewayStack, binding: str) -> dict[str, float]:
    """`aip_gateway_chunk_chain_breaks_total` of `binding` on the gateway, by reason."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{gs.base_url}/metrics")).text
    found: dict[str, float] = {}
    prefix = "aip_gateway_chunk_chain_breaks_total{"
    for line in text.splitlines():
        if line.startswith(prefix) and f'binding="{binding}"' in line:
            labels, value = line[len(prefix) :].rsplit("} ", 1)
            reason = labels.split('reason="', 1)[1].split('"', 1)[0]
            found[reason] = float(value)
    return found


def chat(mode: str) -> dict[str, Any]:
    """A `chat_stream` Action (a streaming capability: only those publish chunks)."""
    request = action(mode)
    body = request["body"]["action"]
    body["capability_id"] = CHAT_STREAM
    body["input"] = {"messages": [{"role": "user", "content": "stream me a reply"}]}
    body["idempotency_key"] = "idem-" + secrets.token_hex(8)  # chat_stream requires one
    return request


def streaming(callback: dict[str, Any] | None) -> dict[str, Any]:
    request = chat("streaming")
    body = request["body"]["action"]
    if callback is not None:
        body["callback"] = callback
    return request


def run_events(run_id: str, target: str) -> dict[str, Any]:
    """A streaming `run_events` Action for `run_id` whose chunks go to `target` (a
    capability with no idempotency requirement: none is sent)."""
    request = chat("streaming")
    body = request["body"]["action"]
    body.update(capability_id=RUN_EVENTS, input={"run_id": run_id})
    body.pop("idempotency_key")
    body["callback"] = {"profile": NATS_PROFILE, "target": target}
    return request


def chunk_schema() -> dict[str, Any]:
    """The published chunk Envelope schema, less the requirement of our extension (the
    workers' bus chunks carry it; the gateway's callback chunk is the plain AIP one)."""
    schema: dict[str, Any] = json.loads((SCHEMAS / "aip.core.v1.stream_chunk.json").read_text())
    schema["required"] = [name for name in schema["required"] if name != "extensions"]
    return schema


def events_request(action_id: str, **fields: Any) -> dict[str, Any]:
    return frame(
        "aip.lifecycle.v1.action_events_request",
        "action_events_request",
        {"action_id": action_id, "include_chunks": False, "follow": False, **fields},
    )


async def test_streaming_chunks_go_to_the_callback_then_the_result(
    gstack: GatewayStack, tmp_path: Path
) -> None:
    gs, caller, gateway = await serve_native(gstack, tmp_path)
    nc: NATS = gs.stack.nc
    target, received, sub = await callback_subject(nc)
    request = sign(streaming({"profile": NATS_PROFILE, "target": target}), caller, CALLER)
    answer = await ask(nc, request)
    result = check_answer(answer, request, gateway, "aip.core.v1.action_result")
    action_id = request["body"]["action"]["id"]
    assert result["action_id"] == action_id
    assert result["status"] == "completed", result
    await nc.flush()
    await asyncio.sleep(0.3)  # published before the answer, on the same connection
    await sub.unsubscribe()

    schema = chunk_schema()
    chunks = []
    for msg in received:
        envelope = json.loads(msg.data)["envelope"]
        headers = msg.headers or {}
        assert headers["AIP-Message-Type"] == "aip.core.v1.stream_chunk"
        assert headers["AIP-Message-Id"] == envelope["message_id"]
        assert headers["AIP-Correlation-Id"] == request["correlation_id"]
        check_signed(envelope, gateway.verify_key)
        assert envelope["security"]["did"] == did_of(gateway)
        assert envelope["in_response_to"] == request["message_id"]
        assert envelope["correlation_id"] == request["correlation_id"]
        assert envelope["session_id"] == request["session_id"]
        assert envelope["to"]["id"] == H1
        jsonschema.validate(envelope, schema)
        chunks.append(envelope["body"]["stream_chunk"])
    assert len(chunks) >= 3, chunks  # deltas, then the terminal chunk
    assert [c["sequence"] for c in chunks] == list(range(len(chunks)))
    assert {c["action_id"] for c in chunks} == {action_id}
    assert chunks[-1]["kind"] == "done"
    assert all(c["kind"] not in ("done", "error") for c in chunks[:-1])
    deltas = [c["data"]["hermes_sse"] for c in chunks if c["kind"] == "data"]
    assert deltas
    assert all(d["event"] == "message" and d["data"]["choices"] for d in deltas)
    assert len({json.loads(m.data)["envelope"]["message_id"] for m in received}) == len(chunks)

    # the same chunks as an events page (with the StreamChunks), every one verified
    request = sign(events_request(action_id, include_chunks=True), caller, CALLER)
    page = check_answer(await ask(nc, request), request, gateway, "aip.lifecycle.v1.action_events")
    assert page["terminal"] is True
    assert "cursor" not in page
    assert page["chunks"] == chunks
    assert [e["data"]["sequence"] for e in page["events"]] == list(range(len(chunks)))
    assert all(e["data"]["verified"] is True for e in page["events"])
    assert page["events"][-1]["kind"] == "stream_chunk.done"

    # refused before anything runs: no callback, a profile not served, targets not allowed
    before = await actions_last_seq(gs)
    cases = [
        ("no callback", None),
        ("profile not served", {"profile": "aip.native.http.v1", "target": "https://x/cb"}),
        ("wildcard", {"profile": NATS_PROFILE, "target": "client.>"}),
        ("a host", {"profile": NATS_PROFILE, "target": "nats://elsewhere:4222/a/b"}),
        ("system subject", {"profile": NATS_PROFILE, "target": "$JS.API.STREAM.LIST"}),
        ("the bus", {"profile": NATS_PROFILE, "target": "aip.hermes.h1.actions"}),
        (
            "the binding's requests",
            {"profile": NATS_PROFILE, "target": "aip.v1.example_com.aip-hermes-worker.v1.x"},
        ),
    ]
    for name, callback in cases:
        request = sign(streaming(callback), caller, CALLER)
        answer = await ask(nc, request)
        assert error_code(answer) == "action.invalid_input", (name, answer["body"])
        check_signed(answer, gateway.verify_key)
        assert answer["in_response_to"] == request["message_id"]
    assert await actions_last_seq(gs) == before  # nothing enqueued


async def test_events_pages_kinds_and_another_principals_action(
    gstack: GatewayStack, tmp_path: Path
) -> None:
    other = nacl.signing.SigningKey.generate()
    other_caller = {"id": "agent:other", "kind": "agent"}
    gs, caller, gateway = await serve_native(
        gstack, tmp_path, more_signers=[f"{did_of(other)} agent:other kind=agent revision=1"]
    )
    nc = gs.stack.nc
    # chat_stream runs only streaming; its chunks go to a callback nobody reads here
    sink = {"profile": NATS_PROFILE, "target": "getaip.sink." + secrets.token_hex(4)}
    request = sign(streaming(sink), caller, CALLER)
    done = check_answer(await ask(nc, request), request, gateway, "aip.core.v1.action_result")
    assert done["status"] == "completed", done
    action_id = done["action_id"]

    # page by page, one event each: every chunk once, in order, the cursor moving on
    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(10):
        fields: dict[str, Any] = {"limit": 1}
        if cursor is not None:
            fields["cursor"] = cursor
        request = sign(events_request(action_id, **fields), caller, CALLER)
        page = check_answer(
            await ask(nc, request), request, gateway, "aip.lifecycle.v1.action_events"
        )
        assert page["action_id"] == action_id
        assert page["terminal"] is True
        assert "chunks" not in page  # include_chunks false
        seen += page["events"]
        cursor = page.get("cursor")
        if cursor is None:
            break
        assert len(page["events"]) == 1
    assert cursor is None
    assert [e["data"]["sequence"] for e in seen] == list(range(len(seen)))
    assert len(seen) >= 2  # the reply's chunks, then done
    assert seen[-1]["kind"] == "stream_chunk.done"
    for event in seen:
        assert event["id"].startswith("evt_")
        assert event["action_id"] == action_id
        assert event["kind"] == f"stream_chunk.{event['data']['kind']}"
        assert event["occurred_at"].endswith("Z")
    assert len({e["id"] for e in seen}) == len(seen)

    # kinds filter: only the done event, and the cursor past everything looked at
    request = sign(events_request(action_id, kinds=["stream_chunk.done"]), caller, CALLER)
    page = check_answer(await ask(nc, request), request, gateway, "aip.lifecycle.v1.action_events")
    assert [e["kind"] for e in page["events"]] == ["stream_chunk.done"]
    assert page["events"][0] == seen[-1]
    assert "cursor" not in page
    request = sign(events_request(action_id, kinds=["stream_chunk.error"], limit=5), caller, CALLER)
    page = check_answer(await ask(nc, request), request, gateway, "aip.lifecycle.v1.action_events")
    assert page["events"] == []
    assert page["terminal"] is True

    # a cursor this binding never gave
    request = sign(events_request(action_id, cursor="later"), caller, CALLER)
    assert error_code(await ask(nc, request)) == "action.invalid_input"

    # another principal's Action (the same id, signed by another bound key) is not found,
    # nor is an id nobody used; the list request is not served
    for probe, signer, sender in (
        (action_id, other, other_caller),
        ("act_" + "0" * 32, caller, CALLER),
    ):
        request = sign(events_request(probe), signer, sender)
        answer = await ask(nc, request)
        assert error_code(answer) == "action.not_found", answer["body"]
    listing = frame("aip.lifecycle.v1.action_list_request", "action_list_request", {"limit": 10})
    assert error_code(await ask(nc, sign(listing, caller, CALLER))) == "capability.unsupported"

    # follow: an empty page of a running Action waits for its first event
    assert gs.stack.fake is not None
    gs.stack.fake.faults.add(RouteDelay(route="POST /v1/chat/completions", delay_s=1.5))
    request = sign(streaming(sink), caller, CALLER)
    running = asyncio.ensure_future(ask(nc, request))  # answers once the run settled
    action_id = request["body"]["action"]["id"]
    for _ in range(50):  # until the gateway holds the child (bounded)
        probe = sign(events_request(action_id), caller, CALLER)
        if (await ask(nc, probe))["message_type"] != "aip.core.v1.error":
            break
        await asyncio.sleep(0.1)
    request = sign(events_request(action_id, follow=True), caller, CALLER)
    page = check_answer(await ask(nc, request), request, gateway, "aip.lifecycle.v1.action_events")
    assert page["events"], page  # waited for the run instead of answering an empty page
    assert page["events"][0]["data"]["sequence"] == 0
    # the Action's own first events, whatever moment the page was taken at
    assert page["events"][0]["action_id"] == action_id
    assert (await running)["body"]["action_result"]["status"] == "completed"


async def callback_subject(nc: NATS) -> tuple[str, list[Msg], Subscription]:
    """A fresh callback subject, the list every message it receives is appended to, in
    order, and the subscription (the caller unsubscribes)."""
    target = f"client.callbacks.{secrets.token_hex(6)}"
    received: list[Msg] = []

    async def keep(msg: Msg) -> None:
        received.append(msg)

    return target, received, await nc.subscribe(target, cb=keep)


async def completed_answer(
    nc: NATS, request: dict[str, Any], gateway: nacl.signing.SigningKey
) -> dict[str, Any]:
    """The checked `action_result` of a completed streaming request, once the callbacks it
    sent have had time to arrive."""
    result = check_answer(await ask(nc, request), request, gateway, "aip.core.v1.action_result")
    assert result["status"] == "completed", result
    await nc.flush()
    await asyncio.sleep(0.3)
    return result


def callback_chunks(received: list[Msg]) -> list[dict[str, Any]]:
    return [json.loads(msg.data)["envelope"]["body"]["stream_chunk"] for msg in received]


async def test_a_long_stream_reaches_the_callback_whole_in_order_once(
    gstack: GatewayStack, tmp_path: Path
) -> None:
    """FLOOD and more chunks of one Action, read incrementally by the follower: every one
    at the callback exactly once, in sequence order, after the signed result vouched for
    them, then the action_result; no chunk counted as a chain break."""
    gs, caller, gateway = await serve_native(gstack, tmp_path)
    nc = gs.stack.nc
    run_id = await flooded_run(gs)
    target, received, sub = await callback_subject(nc)
    result = await completed_answer(nc, sign(run_events(run_id, target), caller, CALLER), gateway)
    await sub.unsubscribe()

    chunks = callback_chunks(received)
    assert len(chunks) > FLOOD, len(chunks)
    assert [c["sequence"] for c in chunks] == list(range(len(chunks)))
    assert {c["action_id"] for c in chunks} == {result["action_id"]}
    ids = [json.loads(m.data)["envelope"]["message_id"] for m in received]
    assert len(set(ids)) == len(ids)
    assert chunks[-1]["kind"] == "done"
    assert sum(c["kind"] == "data" for c in chunks) >= FLOOD
    assert await chain_breaks(gs, NATS_PROFILE) == {}


async def test_the_gateway_bounds_held_chunks_over_all_its_streams(
    gstack: GatewayStack, tmp_path: Path
) -> None:
    """The native binding holds a stream's chunks until the signed result vouches for them.
    With the process-wide bound (AIPD_GATEWAY_MAX_HELD_CHUNK_BYTES) below what a flooded
    run's chunks take, that stream's release ends `over_bound`: nothing reaches its
    callback, its answer is still the completed action_result. What it held is given back:
    a short stream right after is passed on whole."""
    gs, caller, gateway = await serve_native(
        gstack, tmp_path, env={"AIPD_GATEWAY_MAX_HELD_CHUNK_BYTES": str(64 * 1024)}
    )
    nc = gs.stack.nc
    run_id = await flooded_run(gs)  # FLOOD chunk Envelopes of ~600 bytes: over 64 KiB
    target, received, sub = await callback_subject(nc)
    result = await completed_answer(nc, sign(run_events(run_id, target), caller, CALLER), gateway)
    assert callback_chunks(received) == []
    assert (await chain_breaks(gs, NATS_PROFILE)).get("over_bound") == 1.0

    received.clear()
    request = sign(streaming({"profile": NATS_PROFILE, "target": target}), caller, CALLER)
    result = check_answer(await ask(nc, request), request, gateway, "aip.core.v1.action_result")
    assert result["status"] == "completed", result
    await nc.flush()
    await asyncio.sleep(0.3)
    await sub.unsubscribe()
    chunks = callback_chunks(received)
    assert chunks
    assert chunks[-1]["kind"] == "done"
    assert [c["sequence"] for c in chunks] == list(range(len(chunks)))
    assert (await chain_breaks(gs, NATS_PROFILE)).get("over_bound") == 1.0


async def test_a_forged_chunk_on_the_chunk_subject_never_reaches_the_callback(
    gstack: GatewayStack, tmp_path: Path
) -> None:
    """A chunk naming the child with a wrong previous hash, published while it streams:
    counted as a chain break of this binding and never sent; the callback gets exactly the
    executor's chain, and the events page passes only that chain, verified. A forgery
    that links to the real chain and is stored first is never sent either."""
    gs, caller, gateway = await serve_native(gstack, tmp_path)
    nc = gs.stack.nc
    target = f"client.callbacks.{secrets.token_hex(6)}"
    received: list[Msg] = []

    async def keep(msg: Msg) -> None:
        received.append(msg)

    sub = await nc.subscribe(target, cb=keep)
    request = streaming({"profile": NATS_PROFILE, "target": target})
    request["body"]["action"]["input"] = {"messages": [{"role": "user", "content": SLOW_REPLY}]}
    request = sign(request, caller, CALLER)
    action_id = request["body"]["action"]["id"]
    forger = Forger(gs, action_id)
    await forger.start()
    answering = asyncio.ensure_future(ask(nc, request))
    forged_seq = await forger.forge()
    result = check_answer(await answering, request, gateway, "aip.core.v1.action_result")
    assert result["status"] == "completed", result
    await nc.flush()
    await asyncio.sleep(0.3)
    await sub.unsubscribe()

    chunks = callback_chunks(received)
    assert len(chunks) > forged_seq
    assert [c["sequence"] for c in chunks] == list(range(len(chunks)))
    assert FORGED not in json.dumps(chunks)
    assert chunks[-1]["kind"] == "done"
    assert await chain_breaks(gs, NATS_PROFILE) == {"off_chain": 1.0}

    request = sign(events_request(action_id, include_chunks=True), caller, CALLER)
    page = check_answer(await ask(nc, request), request, gateway, "aip.lifecycle.v1.action_events")
    assert page["chunks"] == chunks
    assert all(e["data"]["verified"] is True for e in page["events"])

    # A forgery that links to the real chain and is stored before the real next chunk:
    # the chain forward from chunk 0 runs through it, only the result tells; never sent.
    received.clear()
    sub = await nc.subscribe(target, cb=keep)
    request = streaming({"profile": NATS_PROFILE, "target": target})
    request["body"]["action"]["input"] = {"messages": [{"role": "user", "content": SLOW_REPLY}]}
    request = sign(request, caller, CALLER)
    forger = Forger(gs, request["body"]["action"]["id"], linked=True)
    await forger.start()
    answering = asyncio.ensure_future(ask(nc, request))
    forged_seq = await forger.forge()
    result = check_answer(await answering, request, gateway, "aip.core.v1.action_result")
    assert result["status"] == "completed", result
    await nc.flush()
    await asyncio.sleep(0.3)
    await sub.unsubscribe()
    chunks = callback_chunks(received)
    assert len(chunks) > forged_seq + 1
    assert [c["sequence"] for c in chunks] == list(range(len(chunks)))
    assert FORGED not in json.dumps(chunks)
    assert chunks[-1]["kind"] == "done"
    assert await chain_breaks(gs, NATS_PROFILE) == {"off_chain": 2.0}
