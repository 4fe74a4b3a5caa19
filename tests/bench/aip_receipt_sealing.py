"""What one Action's audit receipts cost to seal, before and after they became AIP 1.0
Envelopes, in CPU per Action.

    .venv/bin/python -m tests.bench.aip_receipt_sealing [--actions 2000] [--per-action 8]

A micro-benchmark, not a test, for the move of `aip.hermes.{endpoint}.audit.{action_id}` to
AIP (issue #25; shared/reference/aip-1.0-wire.md §1.15, §2.7). It seals `--per-action`
receipts shaped like `AuditLog.emit`'s and prints the CPU per Action next to the worker's
1.38 ms per operator Action (BENCHMARKS.md figure 1):

- **before**: each receipt msgspec-encoded and linked (`prev_sha256` = sha256 of the bytes
  before), and one nkey header signature (`ResponseSigner.headers`) per segment;
- **AIP, one signature per segment**: each receipt an AIP Receipt (`hash` over its
  canonical JSON, `previous_hash` the one before) in its own unsigned `receipt_chain`
  Envelope (`worker.wire.receipts.encode_receipt`), and one signed Envelope per segment:
  a separate `segment_sealed` receipt, or (what `worker.bus.audit.seal` does before a
  result) the segment's last receipt itself signed; framed by `encode_receipt`, and as
  shipped by the audit log's `ReceiptFramer` (the same bytes);
- **AIP, every receipt signed**: the same Envelopes, each signed.

One segment per Action (measured with real workers: 1.0 signature per Action). Run on a
shared 2-core machine the absolute figures move with the load; compare the rows of one run.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from schemas.audit import ReceiptEvent
from schemas.codec import encode
from tests.bench.receipt_signing import CPU_PER_ACTION_MS, receipts
from worker.trust.responses import ResponseSigner
from worker.trust.signing import generate_keypair, write_seed_file
from worker.wire.receipts import ReceiptFramer, encode_receipt


def cpu_us_per_action(work: Callable[[], object], actions: int, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        began = time.process_time()
        work()
        best = min(best, time.process_time() - began)
    return best / actions * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--actions", type=int, default=2_000)
    parser.add_argument("--per-action", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        seed_file = Path(directory) / "worker.seed"
        write_seed_file(seed_file, generate_keypair().seed)
        signer = ResponseSigner.load(seed_file)
    per = args.per_action
    sample = receipts(args.actions * per)
    groups = [sample[n : n + per] for n in range(0, len(sample), per)]

    def before() -> None:
        for group in groups:
            link = None
            for receipt in group:
                data = encode(msgspec.structs.replace(receipt, prev_sha256=link))
                link = hashlib.sha256(data).hexdigest()
            signer.headers(encode(msgspec.structs.replace(group[-1], prev_sha256=link)))

    def aip(*, sign_each: bool, seal_apart: bool = False, framer: bool = False) -> None:
        encode_one = ReceiptFramer().encode if framer else encode_receipt
        for group in groups:
            link = None
            for n, receipt in enumerate(group):
                linked = msgspec.structs.replace(receipt, prev_sha256=link)
                signed = sign_each or (n == len(group) - 1 and not seal_apart)
                _, link = encode_one(linked, signer=signer.aip if signed else None)
            if seal_apart:
                sealed = msgspec.structs.replace(
                    group[-1], event=ReceiptEvent.SEGMENT_SEALED, details={}, prev_sha256=link
                )
                encode_one(sealed, signer=signer.aip)

    figures = {
        "before (msgspec + nkey signature per segment)": cpu_us_per_action(before, len(groups)),
        "AIP, a separate signed segment_sealed": cpu_us_per_action(
            lambda: aip(sign_each=False, seal_apart=True), len(groups)
        ),
        "AIP, the last receipt signed, encode_receipt": cpu_us_per_action(
            lambda: aip(sign_each=False), len(groups)
        ),
        "AIP, the last receipt signed, ReceiptFramer (shipped)": cpu_us_per_action(
            lambda: aip(sign_each=False, framer=True), len(groups)
        ),
        "AIP, every receipt signed": cpu_us_per_action(lambda: aip(sign_each=True), len(groups)),
    }
    print(f"{len(groups)} Actions x {per} receipts; CPU to seal one Action's receipts:")
    for what, us in figures.items():
        share = us / 1000 / CPU_PER_ACTION_MS * 100
        print(f"  {what:<54} {us:7.0f} us = {share:5.1f} % of {CPU_PER_ACTION_MS} ms")


if __name__ == "__main__":
    main()
