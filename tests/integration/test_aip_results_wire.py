"""A live worker's results and chunks, read the way a consumer in another language reads
them (plain `json`, PyNaCl, the did:key rules: shared/reference/aip-1.0-wire.md §1.3-§1.5,
§2, docs/publishing.md): nothing from the project's codec decides what is right.

- the result is one `aip.core.v1.action_result` Envelope whose AIP signature verifies, over
  canonical JSON rebuilt by hand, with the did:key of the worker's key (derived here from
  its nkey seed with `nkeys` and base58btc by hand);
- it answers the Action Envelope it was sent in (`in_response_to` = that Envelope's
  `message_id`, `to` = its `from`);
- a non-streaming capability (`models`) publishes no chunk, as upstream: its signed result
  is the whole answer (the provider's document in `output`) and names no last chunk;
- a streaming capability's (`chat_stream`) chunks are unsigned `aip.core.v1.stream_chunk`
  Envelopes, `sequence` 0, 1, 2 … with `data` in one of the documented forms, each naming
  the sha256 of the exact bytes of the one before, and the signed result names the last
  one's;
- the client (`AipClient`) hands out exactly those shapes: the Ack of a publish, each
  chunk's StreamChunk and the result's ActionResult, equal to the bodies read by hand.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from typing import Any

import msgspec
import nacl.signing
import nkeys

from schemas.aip.result import ActionResult as AipActionResult
from schemas.aip.stream import Ack, AckStatus
from schemas.aip.stream import StreamChunk as AipStreamChunk
from tests.integration.stack import ENDPOINT, Stack
from tests.vectors.aip.make_vectors import b58
from worker.client import ActionHandle

OURS = "org.aip-hermes-worker"
CHUNK_BODY_FIELDS = {"action_id", "sequence", "kind", "data", "part"}
DATA_FORMS = {"hermes_sse", "hermes_operator", "hermes_worker"}


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _worker_did(stack: Stack) -> tuple[str, nacl.signing.VerifyKey]:
    """The did:key of the worker's signing key, from its nkey seed file (§2.5)."""
    pair = nkeys.from_seed(bytearray(stack.trust.worker_seed_file.read_bytes().strip()))
    raw = base64.b32decode(pair.public_key.decode())[1:33]  # 56 chars: no padding
    return "did:key:z" + b58(b"\xed\x01" + raw), nacl.signing.VerifyKey(raw)


async def _published(
    stack: Stack, operation: str, input: dict[str, Any] | None = None
) -> tuple[str, bytes, bytes, list[bytes]]:
    """Publish one Action to a live worker: its id, the bytes as published on the actions
    subject, its one result and its chunks, as stored."""
    seen: asyncio.Queue[bytes] = asyncio.Queue()

    async def keep(msg: Any) -> None:
        await seen.put(msg.data)

    sub = await stack.nc.subscribe(stack.subjects.actions(ENDPOINT), cb=keep)
    try:
        action = stack.action(operation, input)
        handle = await stack.publish(action)
        await handle.result(timeout_s=30)
        published = await asyncio.wait_for(seen.get(), 5)
    finally:
        await sub.unsubscribe()
    (result,) = await stack.stream_messages("results", stack.subjects.results(ENDPOINT, action.id))
    chunks = await stack.stream_messages("chunks", stack.subjects.chunks(ENDPOINT, action.id))
    return action.id, published, result, chunks


async def test_a_live_result_is_a_signed_action_result_envelope_and_the_whole_answer(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    action_id, _, data, chunks = await _published(stack, "models")
    envelope = json.loads(data)
    assert data == _canonical(envelope)
    assert envelope["aip_version"] == "1.0"
    assert envelope["message_type"] == "aip.core.v1.action_result"
    assert envelope["message_id"].startswith("msg_")
    assert envelope["sent_at"].endswith("Z")
    body = envelope["body"]["action_result"]
    assert set(body) <= {"action_id", "status", "output", "error"}
    assert (body["action_id"], body["status"]) == (action_id, "completed")
    did, verify_key = _worker_did(stack)
    worker = {"id": f"agent:hermes_operator:{ENDPOINT}", "kind": "agent"}
    assert envelope["from"] == {**worker, "did": did}
    security = envelope.pop("security")
    assert security["did"] == did
    signature = base64.b64decode(security.pop("signature"), validate=True)
    envelope["security"] = security
    verify_key.verify(_canonical(envelope), signature)  # raises unless the worker signed it
    ours = envelope["extensions"][OURS]
    assert (ours["endpoint_id"], ours["settled_by"]) == (ENDPOINT, "w1")
    assert ours["capability"] == f"cap:hermes_agent:{ENDPOINT}:models"
    # Not a streaming capability: no chunk, the provider's document is the output, and the
    # result names no last chunk.
    assert chunks == []
    assert isinstance(body["output"], dict)
    assert body["output"].get("data")
    assert "last_chunk_sha256" not in ours


async def test_a_streaming_capability_s_chunks_are_a_chain_its_signed_result_ends(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    turn = {"messages": [{"role": "user", "content": "stream a short answer"}]}
    action_id, _, data, chunks = await _published(stack, "chat_stream", turn)
    envelope = json.loads(data)
    assert envelope["body"]["action_result"]["status"] == "completed"
    ours = envelope["extensions"][OURS]
    # The chunks: unsigned stream_chunk Envelopes, chained by their exact bytes.
    assert chunks, "a streaming capability's Action ends its chunk stream"
    previous: bytes | None = None
    for sequence, chunk_data in enumerate(chunks):
        chunk = json.loads(chunk_data)
        assert chunk_data == _canonical(chunk)
        assert chunk["message_type"] == "aip.core.v1.stream_chunk"
        assert "security" not in chunk
        assert chunk["from"] == {"id": f"agent:hermes_operator:{ENDPOINT}", "kind": "agent"}
        stream_chunk = chunk["body"]["stream_chunk"]
        assert set(stream_chunk) <= CHUNK_BODY_FIELDS
        assert (stream_chunk["action_id"], stream_chunk["sequence"]) == (action_id, sequence)
        assert len(stream_chunk["data"]) == 1
        assert set(stream_chunk["data"]) <= DATA_FORMS
        link = chunk["extensions"][OURS].get("prev_sha256")
        assert link == (None if previous is None else hashlib.sha256(previous).hexdigest())
        previous = chunk_data
    assert json.loads(chunks[-1])["body"]["stream_chunk"]["kind"] == "done"
    assert ours["last_chunk_sha256"] == hashlib.sha256(chunks[-1]).hexdigest()


async def test_a_live_result_answers_the_action_envelope_it_was_sent_in(stack: Stack) -> None:
    await stack.spawn("w1")
    _, published, data, _ = await _published(stack, "models")
    action_envelope = json.loads(published)
    result_envelope = json.loads(data)
    assert result_envelope["in_response_to"] == action_envelope["message_id"]
    assert result_envelope["to"] == action_envelope["from"]


async def test_the_client_hands_out_aip_s_ack_stream_chunks_and_action_result(
    stack: Stack,
) -> None:
    """`handle.ack` is AIP's Ack; each `chunk_envelopes()` item's `.aip` is the StreamChunk
    its Envelope bytes carry and `result_envelope().aip` the ActionResult, equal to the
    bodies read here with plain `json` from what the streams hold."""
    await stack.spawn("w1")
    turn = {"messages": [{"role": "user", "content": "stream a short answer"}]}
    action = stack.action("chat_stream", turn)
    handle = await stack.client.publish(action)
    assert handle.ack == Ack(action_id=action.id, status=AckStatus.QUEUED)
    assert ActionHandle(stack.client, ENDPOINT, action.id, duplicate=True).ack.status == "cached"
    items = [item async for item in handle.chunk_envelopes(idle_timeout_s=20)]
    stored = await stack.stream_messages("chunks", stack.subjects.chunks(ENDPOINT, action.id))
    assert [item.data for item in items] == stored
    for item in items:
        assert isinstance(item.aip, AipStreamChunk)
        assert msgspec.to_builtins(item.aip) == json.loads(item.data)["body"]["stream_chunk"]
    assert [item.aip.sequence for item in items] == list(range(len(items)))
    assert items[-1].aip.kind == "done"
    ended = await handle.result_envelope(timeout_s=20)
    (result,) = await stack.stream_messages("results", stack.subjects.results(ENDPOINT, action.id))
    assert ended.data == result
    assert isinstance(ended.aip, AipActionResult)
    assert msgspec.to_builtins(ended.aip) == json.loads(result)["body"]["action_result"]
    assert ended.body == json.loads(result)["body"]["action_result"]
    assert (ended.aip.action_id, ended.aip.status) == (action.id, "completed")
    # A non-streaming capability: no chunk at all, the ActionResult alone says it ended.
    read = await stack.client.publish(stack.action("models"))
    assert [item async for item in read.chunk_envelopes(idle_timeout_s=20)] == []
    stored_read = await stack.client.stored_result_envelope(ENDPOINT, read.action_id)
    assert stored_read is not None
    assert stored_read.aip.status == "completed"
    assert stored_read.aip.output == json.loads(stored_read.data)["body"]["action_result"]["output"]
