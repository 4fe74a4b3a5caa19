"""Micro-timing of AIP 1.0 signing (not a test): the cost of canonicalising, signing and
verifying one typical Action Envelope, in µs of this process's CPU time per operation
(CPU time, not wall time, so that other work on a shared machine inflates it less).

    .venv/bin/python -m tests.bench.aip_signing [--number N]

The Envelope is what a gateway sends for a `chat_stream` call: ids, a Principal, a small
chat input with a float and non-ASCII text, trace and vendor extensions (about 900 bytes).
"""

from __future__ import annotations

import argparse
import base64
import time
import timeit

from worker.aip import AipSigner, canonical_bytes, loads, sign_envelope, verify_envelope
from worker.aip.signing import encode_envelope, signing_bytes

SIGNER = AipSigner.from_seed(bytes([21]) * 32)
PRINCIPAL = {"id": "service:getaip:gateway", "kind": "service", "trust_domain": "example.com"}
ACTION_ENVELOPE = {
    "aip_version": "1.0",
    "message_type": "aip.core.v1.action",
    "message_id": "msg_0193a1b2c3d47e8f9a0b1c2d3e4f5a6b",
    "sent_at": "2026-12-01T23:00:00Z",
    "correlation_id": "corr_0193a1b2c3d47e8f9a0b1c2d3e4f5a6c",
    "session_id": "sess_0193a1b2c3d47e8f9a0b1c2d3e4f5a6d",
    "idempotency_key": "order-7781-reply",
    "to": {"id": "agent:hermes_operator:hermes-1", "kind": "agent"},
    "trace": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
    "extensions": {"org.aip-hermes-worker": {"endpoint_id": "hermes-1"}},
    "body": {
        "action": {
            "id": "act_0193a1b2c3d47e8f9a0b1c2d3e4f5a6e",
            "capability_id": "cap:hermes_agent:hermes-1:chat_stream",
            "mode": "streaming",
            "idempotency_key": "order-7781-reply",
            "timeout_ms": 120000,
            "input": {
                "model": "hermes-agent",
                "messages": [
                    {"role": "system", "content": "Tu es un assistant précis."},
                    {"role": "user", "content": "Résume la commande 7781 — délai, coût, état."},
                ],
                "temperature": 0.2,
                "max_tokens": 512,
            },
            "identity": {
                "tenant": {"id": "tenant-acme"},
                "human_actor": {"id": "user:alice", "kind": "human"},
            },
            "observability": {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"},
        }
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    signed = sign_envelope(ACTION_ENVELOPE, SIGNER, PRINCIPAL)
    wire = encode_envelope(signed)
    unsigned_bytes = signing_bytes(signed)
    raw_signature = base64.b64decode(signed["security"]["signature"])
    verify_key = SIGNER.public_key.verify_key
    cases = {
        "canonicalise (canonical_bytes of the signed Envelope)": lambda: canonical_bytes(signed),
        "Ed25519 sign of the canonical bytes": lambda: SIGNER.sign(unsigned_bytes),
        "sign_envelope (checks + canonical + sign)": lambda: sign_envelope(
            ACTION_ENVELOPE, SIGNER, PRINCIPAL
        ),
        "Ed25519 verify of the canonical bytes": lambda: verify_key.verify(
            unsigned_bytes, raw_signature
        ),
        "decode received bytes (strict loads)": lambda: loads(wire),
        "verify_envelope (decode + checks + canonical + verify)": lambda: verify_envelope(wire),
    }
    print(
        f"Action Envelope: {len(wire)} bytes on the wire, {args.number} runs each, "
        "best of 5, CPU time"
    )
    for name, call in cases.items():
        runs = timeit.repeat(call, number=args.number, repeat=5, timer=time.process_time)
        best = min(runs) / args.number
        print(f"{best * 1e6:8.1f} µs  {name}")


if __name__ == "__main__":
    main()
