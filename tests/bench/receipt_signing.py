"""What signing every audit receipt costs the hot path, in CPU per Action.

    .venv/bin/python -m tests.bench.receipt_signing [--receipts 20000] [--per-action 8]

A micro-benchmark, not a test: it measures the work signed receipts add to the worker (the
AIP-signed `receipt_chain` Envelope of a receipt, `worker.wire.receipts.encode_receipt` with
a signer, against the same Envelope unsigned; and the link `worker.bus.audit` adds to each
receipt of a segment: a struct copy with `prev_sha256`) against the unsigned Envelope
every receipt is sent in, on receipts shaped like `AuditLog.emit`'s, and prints the cost per Action
next to the worker's 1.38 ms of CPU per operator Action, both for a signature on every
receipt and for the segments the worker signs (`--signatures-per-action`: measured with
real workers as 1.0, one at a time and 50 operator Actions at once, 8 receipts each).
docs/security.md cites the figures. It also reports what `audit` pays to verify a receipt.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from schemas.audit import Receipt, ReceiptEvent
from worker.trust.responses import ResponseSigner, verify_receipt
from worker.trust.signing import TrustedGatewayKeys, generate_keypair, write_seed_file
from worker.wire.receipts import encode_receipt

#: The worker's CPU per operator Action in BENCHMARKS.md's figure 1.
CPU_PER_ACTION_MS = 1.38


def receipts(count: int) -> list[Receipt]:
    """Receipts as `AuditLog.emit` builds them (ids, a worker id, a few scalar details)."""
    action_id = "act_" + "0123456789abcdef" * 2
    events = list(ReceiptEvent)
    return [
        Receipt(
            receipt_id=f"{action_id}:{events[n % len(events)].value}:1:worker-host-1234:{n}",
            event=events[n % len(events)],
            action_id=action_id,
            endpoint_id="hermes-1",
            worker_id="worker-host-1234",
            fence=1,
            trace_id="trace-0123456789abcdef",
            ts_unix_ms=1_796_000_000_000 + n,
            details={"capability": "cap:hermes_agent:hermes-1:models", "attempt": 1, "ok": True},
        )
        for n in range(count)
    ]


def cpu_us_each(work: Callable[[], object], count: int, rounds: int = 5) -> float:
    """The best of `rounds` CPU times of `work` (which handles `count` items), per item."""
    best = float("inf")
    for _ in range(rounds):
        began = time.process_time()
        work()
        best = min(best, time.process_time() - began)
    return best / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--receipts", type=int, default=20_000)
    parser.add_argument("--per-action", type=int, default=8, help="receipts one Action leaves")
    parser.add_argument(
        "--signatures-per-action", type=float, default=1.0, help="segments one Action leaves"
    )
    args = parser.parse_args()
    sample = receipts(args.receipts)
    with tempfile.TemporaryDirectory() as directory:
        pair = generate_keypair()
        seed_file = Path(directory) / "worker.seed"
        write_seed_file(seed_file, pair.seed)
        signer = ResponseSigner.load(seed_file)
    trusted = TrustedGatewayKeys.of([signer.public_key])
    encoded = [encode_receipt(r, signer=None)[0] for r in sample]
    signed = [encode_receipt(r, signer=signer.aip)[0] for r in sample]

    encode_us = cpu_us_each(lambda: [encode_receipt(r, signer=None) for r in sample], len(sample))
    sign_us = (
        cpu_us_each(lambda: [encode_receipt(r, signer=signer.aip) for r in sample], len(sample))
        - encode_us
    )
    link = "0" * 64
    link_us = (
        cpu_us_each(
            lambda: [
                encode_receipt(msgspec.structs.replace(r, prev_sha256=link), signer=None)
                for r in sample
            ],
            len(sample),
        )
        - encode_us
    )
    verify_us = cpu_us_each(lambda: [verify_receipt(d, trusted) for d in signed], len(sample))
    every_us = sign_us * args.per_action
    segments_us = sign_us * args.signatures_per_action + link_us * args.per_action
    print(f"receipts measured: {len(sample)}, {len(encoded[0])} bytes each")
    print(f"Envelope, unsigned (always paid): {encode_us:7.2f} us per receipt")
    print(f"sign (seal + Ed25519 signature):  {sign_us:7.2f} us per signed receipt")
    print(f"link (previous_hash copy):        {link_us:7.2f} us per receipt")
    print(f"verify (paid by `audit`):         {verify_us:7.2f} us per signed receipt")
    for what, added in (
        (f"every receipt signed ({args.per_action}/Action)", every_us),
        (f"segments ({args.signatures_per_action:g} signatures/Action)", segments_us),
    ):
        share = added / 1000 / CPU_PER_ACTION_MS * 100
        print(f"added per Action, {what}: {added:.0f} us = {share:.1f} % of {CPU_PER_ACTION_MS} ms")


if __name__ == "__main__":
    main()
