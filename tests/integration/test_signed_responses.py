"""Signed responses through live workers: what a consumer with the trusted worker keys
believes, and what it refuses.

A result (an `action_result` Envelope) is believed only with a trusted worker's AIP
signature; chunks (unsigned `stream_chunk` Envelopes) only as links of a
chain the signed result closes; a forgery published first by someone with publish rights
is skipped, not returned. A worker without a key answers `connector_host.response_signing`
and sends nothing to Hermes; one with an unusable key does not start. A takeover by a
worker with another key continues the chain.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
from typing import Any

import pytest

from schemas.chunk import ChunkKind, DoneChunk, make_chunk
from schemas.errors import ErrorCode
from schemas.result import ActionResult, ResultStatus
from tests.aip_wire import result_view
from tests.integration.stack import ENDPOINT, Stack
from worker.client import AipClient, ChunkRetraction
from worker.errors import CannotSign, UnverifiedResponse
from worker.store.clock import now_ms
from worker.testing.fake_hermes import RouteDelay
from worker.testing.scenario import SLOW_REPLY
from worker.trust.responses import ResponseSigner, verify_dead_letter
from worker.trust.signing import (
    TrustedGatewayKeys,
    generate_keypair,
    write_seed_file,
)
from worker.wire.chunks import encode_chunk
from worker.wire.results import encode_result

MODELS = "GET /v1/models"
POST_RUNS = "POST /v1/runs"


def _worker_keys(stack: Stack) -> TrustedGatewayKeys:
    return TrustedGatewayKeys.load(stack.trust.worker_keys_file, what="trusted worker keys file")


def _forged_result(action_id: str, signer: ResponseSigner | None = None) -> bytes:
    return encode_result(
        ActionResult(
            action_id=action_id,
            capability=f"cap:hermes_agent:{ENDPOINT}:models",
            endpoint_id=ENDPOINT,
            status=ResultStatus.COMPLETED,
            output={"data": [{"id": "forged-model"}]},
            settled_by="w1",
            fence=1,
            settled_at_unix_ms=now_ms(),
        ),
        action=None,
        signer=signer.aip if signer is not None else None,
        endpoint_id=ENDPOINT,
    )


def _turn() -> dict[str, Any]:
    """A `chat_stream` turn: a streaming capability, so its Action has a chunk chain."""
    return {"messages": [{"role": "user", "content": "stream a short answer"}]}


async def test_results_chunks_and_dlq_entries_carry_the_workers_signature(stack: Stack) -> None:
    await stack.spawn("w1")
    handle = await stack.publish(stack.action("chat_stream", _turn()))
    chunks = [chunk async for chunk in handle.chunks(idle_timeout_s=20)]  # chain verified
    assert isinstance(chunks[-1], DoneChunk)
    assert chunks[0].prev_sha256 is None
    assert all(c.prev_sha256 for c in chunks[1:])
    result = await handle.result(timeout_s=20)
    assert result.status is ResultStatus.COMPLETED
    assert result.last_chunk_sha256 is not None
    ((data, headers),) = await stack.stream_messages_with_headers(
        "results", stack.subjects.results(ENDPOINT, handle.action_id)
    )
    signer = ResponseSigner.load(stack.trust.worker_seed_file)
    worker_key = signer.public_key
    assert result_view(data)["signer_did"] == signer.aip.did  # the same key, as a did:key
    assert not any(name.lower().startswith("aip-sign") for name in headers)
    await stack.publish_raw(b'{"not": "an action"}')
    for _ in range(100):
        if await stack.dlq():
            break
        await asyncio.sleep(0.1)
    (data,) = await stack.stream_messages("dlq", stack.subjects.dlq(ENDPOINT))
    entry, dlq_signer = verify_dead_letter(data, _worker_keys(stack))
    assert dlq_signer == worker_key
    assert entry.facts.kept == b'{"not": "an action"}'
    assert entry.action_id is None  # never authenticated: filed under its own dlq_ id


@pytest.mark.parametrize("forger", ["unsigned", "untrusted_key"])
async def test_a_forged_result_published_first_is_not_returned(stack: Stack, forger: str) -> None:
    assert stack.fake is not None
    stack.fake.faults.add(RouteDelay(route=MODELS, delay_s=1.5, times=1))
    await stack.spawn("w1")
    handle = await stack.publish(stack.action("models"))
    forger_key = None
    if forger == "untrusted_key":
        seed = stack.root / "forger.seed"
        write_seed_file(seed, generate_keypair().seed)
        forger_key = ResponseSigner.load(seed)
    forged = _forged_result(handle.action_id, forger_key)
    headers = {"Nats-Msg-Id": f"{handle.action_id}:result"}  # the id a result used to have
    await stack.nc.jetstream().publish(
        stack.subjects.results(ENDPOINT, handle.action_id), forged, headers=headers
    )
    # A client that verifies nothing believes whatever came first: the forgery.
    unverified = AipClient(stack.nc)
    believed = await unverified.handle(ENDPOINT, handle.action_id).result(timeout_s=5)
    assert believed.output == {"data": [{"id": "forged-model"}]}
    # The verifying client skips it and returns the worker's own result.
    result = await handle.result(timeout_s=20)
    assert result.status is ResultStatus.COMPLETED
    assert result.output != believed.output
    assert result.settled_by == "w1"
    assert len(await stack.results(handle.action_id)) == 2  # both are on the stream
    stored = await stack.client.stored_result(ENDPOINT, handle.action_id)
    assert stored == result


async def _forge_chunk_0(stack: Stack, action_id: str, msg_id: str | None = None) -> Any:
    """Publish a forged data chunk 0 on `action_id`'s chunk subject; returns the chunk."""
    forged = make_chunk(
        ChunkKind.DATA,
        action_id=action_id,
        endpoint_id=ENDPOINT,
        seq=0,
        ts_unix_ms=now_ms(),
        payload={"data": [{"id": "forged-model"}]},
    )
    forged_bytes = encode_chunk(forged)
    await stack.nc.jetstream().publish(
        stack.subjects.chunks(ENDPOINT, action_id),
        forged_bytes,
        headers={"Nats-Msg-Id": msg_id} if msg_id is not None else None,
    )
    return forged


async def test_a_non_streaming_action_has_no_chunks_and_a_chunk_forged_for_it_is_refused(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    handle = await stack.publish(stack.action("models"))
    assert [chunk async for chunk in handle.chunks(idle_timeout_s=20)] == []
    assert (await handle.result(timeout_s=20)).last_chunk_sha256 is None
    # A chunk someone published on a non-streaming Action's subject: yielded while the
    # result is not there yet, then refused once the signed result says it has no chunk.
    action = stack.action("models")
    await _forge_chunk_0(stack, action.id)
    handle = await stack.publish(action)
    with pytest.raises(UnverifiedResponse, match="names no chunk"):
        async for _ in handle.chunks(idle_timeout_s=20):
            pass
    # The verified-only reader never yields it: the result vouches for no chunk.
    assert [c async for c in handle.chunks(idle_timeout_s=20, verified_only=True)] == []


async def test_a_forged_chunk_breaks_the_chain_and_is_refused(stack: Stack) -> None:
    await stack.spawn("w1")
    action = stack.action("chat_stream", _turn())
    # Published before the worker's own chunk 0, under the seq-only Msg-Id chunks used to
    # have: with content-bound ids both are stored, and the reader meets two chunks at seq 0.
    forged = await _forge_chunk_0(stack, action.id, msg_id=f"{action.id}:0")
    handle = await stack.publish(action)
    # The streaming reader yielded the forgery (alone at seq 0 when read), then held both
    # branches from the worker's chunk 0 on; the signed result vouches for the worker's, so
    # the reader retracts seq 0 and yields the worker's chain from there.
    streamed = [c async for c in handle.chunks(idle_timeout_s=20)]
    assert streamed[0] == forged
    retraction = streamed[1]
    assert isinstance(retraction, ChunkRetraction)
    assert (retraction.from_seq, retraction.to_seq) == (0, 0)
    assert retraction.sha256 == (hashlib.sha256(encode_chunk(forged)).hexdigest(),)
    assert (await handle.result(timeout_s=20)).status is ResultStatus.COMPLETED
    # The verified-only reader yields the signed chain, never the forgery nor a retraction.
    verified = [c async for c in handle.chunks(idle_timeout_s=20, verified_only=True)]
    assert forged not in verified
    assert verified == streamed[2:]
    assert [c.seq for c in verified if not isinstance(c, ChunkRetraction)] == list(
        range(len(verified))
    )


async def test_a_worker_without_a_signing_key_refuses_unsigned_and_sends_nothing(
    stack: Stack,
) -> None:
    assert stack.fake is not None
    # Such a worker stays unready and takes nothing (tests/integration/test_serving_gate.py);
    # the development flag makes it consume, and each Action is still refused, unsigned.
    await stack.spawn(
        "w-nokey", unset=("AIPD_WORKER_SIGNING_KEY_FILE",), AIPD_SERVE_WHEN_UNREADY="true"
    )
    handle = await stack.publish(stack.action("models"))
    with pytest.raises(CannotSign, match="could not sign"):
        await handle.result(timeout_s=20)
    result = await AipClient(stack.nc).handle(ENDPOINT, handle.action_id).result(timeout_s=5)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code is ErrorCode.HOST_RESPONSE_SIGNING
    assert (result.error.retryable, result.error.uncertain_outcome) == (False, False)
    (data,) = await stack.stream_messages(
        "results", stack.subjects.results(ENDPOINT, handle.action_id)
    )
    assert result_view(data)["signer_did"] is None  # no security.signature
    assert stack.fake.stats().count(MODELS) == 0
    # The CLI refuses it too, with its own exit status; without keys it only warns.
    cli = [sys.executable, "-m", "worker", "result", handle.action_id, "--endpoint", ENDPOINT]
    env = {**os.environ, "AIPD_NATS_URL": stack.nats_url}
    verified = await asyncio.to_thread(
        subprocess.run,
        [*cli, "--trusted-worker-keys", str(stack.trust.worker_keys_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verified.returncode == 4, verified.stderr
    assert "connector_host.response_signing" in verified.stderr
    unverified = await asyncio.to_thread(
        subprocess.run, cli, env=env, capture_output=True, text=True, timeout=60
    )
    # Read without keys: the (unverified) result is a failure, so `result` exits 1.
    assert unverified.returncode == 1, unverified.stderr
    assert "not verified" in unverified.stderr


async def test_unsigned_responses_may_be_allowed_for_development(stack: Stack) -> None:
    await stack.spawn(
        "w-dev", unset=("AIPD_WORKER_SIGNING_KEY_FILE",), AIPD_ALLOW_UNSIGNED_RESPONSES="true"
    )
    handle = await stack.publish(stack.action("models"))
    result = await AipClient(stack.nc).handle(ENDPOINT, handle.action_id).result(timeout_s=20)
    assert result.status is ResultStatus.COMPLETED
    with pytest.raises(UnverifiedResponse):  # a verifying consumer still refuses it
        await handle.result(timeout_s=2)


async def test_a_signing_key_the_worker_cannot_read_refuses_the_start(stack: Stack) -> None:
    loose = stack.root / "loose.seed"
    loose.write_bytes(generate_keypair().seed)
    os.chmod(loose, 0o644)
    with pytest.raises(RuntimeError, match="exited"):
        await stack.spawn("w-loose", AIPD_WORKER_SIGNING_KEY_FILE=str(loose))
    log = stack.workers[-1].log_text()
    assert "connector_host.response_signing" in log
    assert "chmod 600" in log


async def test_a_takeover_by_a_worker_with_another_key_continues_the_chain(stack: Stack) -> None:
    assert stack.fake is not None
    w1 = await stack.spawn("w1", fault_points="mid_stream=exit")
    action, _ = await stack.operator(f"{SLOW_REPLY} take me over")
    assert await asyncio.to_thread(w1.wait_exit, 30) == 137, w1.log_tail()
    second_key = stack.trust.add_worker_key("w2")
    await stack.spawn("w2", AIPD_WORKER_SIGNING_KEY_FILE=str(second_key))
    client = AipClient(stack.nc, trusted_worker_keys=stack.trust.worker_keys_file)
    handle = client.handle(ENDPOINT, action.id)
    chunks = [chunk async for chunk in handle.chunks(idle_timeout_s=60)]  # whole chain
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.settled_by == "w2"
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert stack.fake.stats().count(POST_RUNS) == 1
    (data,) = await stack.stream_messages("results", stack.subjects.results(ENDPOINT, action.id))
    assert result_view(data)["signer_did"] == ResponseSigner.load(second_key).aip.did
    # The first worker's key alone does not verify the second one's result.
    w1_only = stack.root / "w1-only.txt"
    w1_only.write_text(ResponseSigner.load(stack.trust.worker_seed_file).public_key + "\n")
    with pytest.raises(UnverifiedResponse):
        AipClient(stack.nc, trusted_worker_keys=w1_only).believe_result(data)
