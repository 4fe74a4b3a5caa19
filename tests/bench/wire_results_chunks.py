"""Micro-timing of the results and chunks wire (not a test, issue 25: "measure the hash chain
against signing every chunk"): µs of this process's CPU time per operation, best of 5.

    .venv/bin/python -m tests.bench.wire_results_chunks [--number N]

A typical streamed delta chunk and a typical completed result, each sealed as the worker
seals it (`worker.wire`: a chunk unsigned, a result signed) against the msgspec encoding the
subjects carried before, and a chunk sealed *with* a signature: what signing every chunk
would cost instead of the hash chain.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
import timeit

from schemas.chunk import ChunkKind, make_chunk
from schemas.codec import encode
from schemas.result import ActionResult, ResultStatus
from worker.aip.signing import AipSigner
from worker.trust.signing import generate_keypair, sign_envelope
from worker.wire.chunks import chunk_message_id, decode_chunk, encode_chunk
from worker.wire.envelopes import seal
from worker.wire.results import decode_result, encode_result, worker_principal

SIGNER = AipSigner.from_seed(bytes([21]) * 32)
OLD_SEED = generate_keypair().seed
ACTION = "act_0193a1b2c3d47e8f9a0b1c2d3e4f5a6e"
CHUNK = make_chunk(
    ChunkKind.DATA,
    action_id=ACTION,
    endpoint_id="hermes-1",
    seq=41,
    ts_unix_ms=1_796_000_000_123,
    payload={"delta": " the order ships Tuesday"},
    provider_event="message.delta",
    run_id="run_01HZX",
    prev_sha256=hashlib.sha256(b"chunk 40").hexdigest(),
)
RESULT = ActionResult(
    action_id=ACTION,
    capability="cap:hermes_agent:hermes-1:chat_stream",
    endpoint_id="hermes-1",
    status=ResultStatus.COMPLETED,
    output={"text": "Order 7781 ships Tuesday; cost 42.50 EUR.", "usage": {"tokens": 312}},
    settled_by="worker-1#3f2a",
    fence=1,
    settled_at_unix_ms=1_796_000_000_456,
    last_chunk_sha256=hashlib.sha256(b"terminal").hexdigest(),
    action_sha256=hashlib.sha256(b"action").hexdigest(),
)


def _signed_chunk() -> bytes:
    """The same chunk Envelope, but signed: the alternative to the hash chain."""
    envelope = json.loads(encode_chunk(CHUNK))
    return seal(
        "aip.core.v1.stream_chunk",
        envelope["body"]["stream_chunk"],
        sender=worker_principal("hermes-1"),
        signer=SIGNER,
        extension=envelope["extensions"]["org.aip-hermes-worker"],
        message_id=chunk_message_id(CHUNK),
        sent_at=envelope["sent_at"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    chunk_wire, result_wire = encode_chunk(CHUNK), encode_result(
        RESULT, action=None, signer=SIGNER, endpoint_id="hermes-1"
    )
    cases = {
        "chunk: msgspec encode (the old wire)": lambda: encode(CHUNK),
        "chunk: encode_chunk, unsigned Envelope (the wire)": lambda: encode_chunk(CHUNK),
        "chunk: + sha256 of its bytes (the chain link)": lambda: hashlib.sha256(
            encode_chunk(CHUNK)
        ).hexdigest(),
        "chunk: signed Envelope (signing every chunk)": _signed_chunk,
        "chunk: decode_chunk": lambda: decode_chunk(chunk_wire),
        "result: msgspec encode (the old body)": lambda: encode(RESULT),
        "result: msgspec encode + nkey header signature (the old wire)": lambda: (
            sign_envelope(encode(RESULT), OLD_SEED)
        ),
        "result: encode_result, signed Envelope (the wire)": lambda: encode_result(
            RESULT, action=None, signer=SIGNER, endpoint_id="hermes-1"
        ),
        "result: decode_result (signature verified)": lambda: decode_result(result_wire),
    }
    print(
        f"chunk Envelope {len(chunk_wire)} bytes (msgspec {len(encode(CHUNK))}); result "
        f"Envelope {len(result_wire)} bytes (msgspec {len(encode(RESULT))}); "
        f"{args.number} runs each, best of 5, CPU time"
    )
    for name, call in cases.items():
        runs = timeit.repeat(call, number=args.number, repeat=5, timer=time.process_time)
        print(f"{min(runs) / args.number * 1e6:8.1f} µs  {name}")


if __name__ == "__main__":
    main()
